"""What one forward pass computes: new tokens of several requests, each over its own KV slots."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class ForwardBatch:
    input_ids: torch.Tensor  # [T] new tokens of all requests, request after request
    positions: torch.Tensor  # [T] absolute positions
    out_slots: torch.Tensor  # [T] KV slots the new tokens' K/V are written to
    extend_lens: list[int]  # new tokens per request
    seq_lens: list[int]  # total tokens per request after this pass (cached prefix + new)
    slot_rows: list[torch.Tensor]  # per request: slots of all its seq_lens positions
    logits_index: torch.Tensor  # [N] rows of the T new tokens whose logits are wanted

    @property
    def batch_size(self) -> int:
        return len(self.extend_lens)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.numel())
