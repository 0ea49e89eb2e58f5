"""The narrow interface through which the engine drives a grammar (implemented in `grammar/`).

The runtime never imports xgrammar or `grammar/` directly: a request carries an object with
`new_matcher()`, and each matcher answers the few questions decoding needs. Bitmasks are int32
tensors of shape [batch, ceil(vocab / 32)], bit j of word i allowing token 32 * i + j.
"""

from __future__ import annotations

from typing import Protocol

import torch


class TokenMatcher(Protocol):
    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the allowed-next-token mask of the current state into `bitmask[row]`."""

    def accept(self, token_id: int) -> bool:
        """Advance by one token; False (state unchanged) if the grammar forbids it."""

    def rollback(self, num_tokens: int) -> None:
        """Undo the last `num_tokens` accepted tokens (used by jump-forward verification)."""

    def is_terminated(self) -> bool:
        """True once the grammar accepted its end (the stop token was accepted)."""

    def is_completed(self) -> bool:
        """True where the text so far is a complete match (the stop token is allowed now)."""

    def jump_forward_tokens(self, learn: bool = True) -> list[int]:
        """Tokens the grammar forces from the current state (may be empty); not accepted yet.
        `learn=False`: the caller inserts them without the model (direct jump-forward), so the
        matcher must not take them for the model's own choices."""


class CompiledConstraint(Protocol):
    def new_matcher(self) -> TokenMatcher:
        """A fresh matcher at the grammar's start state (cheap: shares the compiled grammar)."""
