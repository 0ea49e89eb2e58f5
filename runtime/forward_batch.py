"""What one forward pass computes: new tokens of several requests, each over its own KV slots."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class PrefixGroup:
    """Requests of a pass whose slot rows start with the same `shared_len` slots (a prefix they
    share in the radix cache). Cascade attention reads those slots once for all `members` (indices
    into the batch's requests) and each member's own suffix separately."""

    shared_len: int
    members: list[int]


@dataclass
class ForwardBatch:
    input_ids: torch.Tensor  # [T] new tokens of all requests, request after request
    positions: torch.Tensor  # [T] absolute positions
    out_slots: torch.Tensor  # [T] KV slots the new tokens' K/V are written to
    extend_lens: list[int]  # new tokens per request
    seq_lens: list[int]  # total tokens per request after this pass (cached prefix + new)
    slot_rows: list[torch.Tensor]  # per request: slots of all its seq_lens positions
    logits_index: torch.Tensor  # [N] rows of the T new tokens whose logits are wanted, increasing
    # Shared-prefix groups (cascade attention); empty: every request attends over its own row.
    # Backends without cascade support ignore them (slot_rows stay complete).
    prefix_groups: list[PrefixGroup] = field(default_factory=list)

    @property
    def batch_size(self) -> int:
        return len(self.extend_lens)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.numel())

    def logits_rows(self, x: torch.Tensor) -> torch.Tensor:
        """The rows of `x` [T, ...] whose logits are wanted: `x` itself when that is every row (a
        decode pass; logits_index is increasing, so N == T means all of them), sparing an index op."""
        return x if self.logits_index.shape[0] == x.shape[0] else x[self.logits_index]
