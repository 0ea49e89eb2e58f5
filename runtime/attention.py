"""Attention over the slot-based KV pool. One interface, two backends (torch here; Triton for CUDA).

Each request's new tokens attend to all of its slots (cached prefix + themselves), causally.
`prepare` runs once per forward pass and builds the gather indices and masks that every layer reuses.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
import torch.nn.functional as F

from runtime.forward_batch import ForwardBatch


class AttentionBackend(ABC):
    @abstractmethod
    def prepare(self, batch: ForwardBatch) -> None:
        """Precompute per-pass metadata (called once before the layers run)."""

    @abstractmethod
    def forward(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
        """q: [T, H, D]; caches: [num_slots, KVH, D] (this pass's K/V already written) -> [T, H, D]."""


class TorchAttentionBackend(AttentionBackend):
    """SDPA per extend request (long, compute-bound) and one padded SDPA for all decode rows."""

    def prepare(self, batch: ForwardBatch) -> None:
        self.extends: list[tuple[int, int, torch.Tensor, torch.Tensor | None]] = []
        decode_rows, decode_slots = [], []
        offset = 0
        for ext, seq, slots in zip(batch.extend_lens, batch.seq_lens, batch.slot_rows):
            if ext == 1:
                decode_rows.append(offset)
                decode_slots.append(slots)
            else:
                # Bottom-right aligned causal mask: new token i sees positions <= prefix + i.
                mask = None
                if seq != ext:
                    q_pos = torch.arange(seq - ext, seq).unsqueeze(1)
                    mask = torch.arange(seq).unsqueeze(0) <= q_pos
                self.extends.append((offset, ext, slots, mask))
            offset += ext
        self.decode_rows = torch.tensor(decode_rows, dtype=torch.int64)
        if decode_slots:
            max_len = max(s.numel() for s in decode_slots)
            table = torch.zeros(len(decode_slots), max_len, dtype=torch.int64)
            mask = torch.zeros(len(decode_slots), 1, 1, max_len, dtype=torch.bool)
            for i, s in enumerate(decode_slots):
                table[i, : s.numel()] = s
                mask[i, 0, 0, : s.numel()] = True
            self.decode_table, self.decode_mask = table, mask
            self.decode_uniform = all(s.numel() == max_len for s in decode_slots)

    def forward(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(q)
        for start, ext, slots, mask in self.extends:
            qe = q[start : start + ext].transpose(0, 1)  # [H, E, D]
            k = k_cache[slots].transpose(0, 1)  # [KVH, L, D]
            v = v_cache[slots].transpose(0, 1)
            o = F.scaled_dot_product_attention(
                qe.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0),
                attn_mask=mask, is_causal=mask is None, enable_gqa=True,
            )
            out[start : start + ext] = o[0].transpose(0, 1)
        if self.decode_rows.numel():
            qd = q[self.decode_rows].unsqueeze(2)  # [B, H, 1, D]
            k = k_cache[self.decode_table].transpose(1, 2)  # [B, KVH, L, D]
            v = v_cache[self.decode_table].transpose(1, 2)
            mask = None if self.decode_uniform else self.decode_mask
            o = F.scaled_dot_product_attention(qd, k, v, attn_mask=mask, enable_gqa=True)
            out[self.decode_rows] = o.squeeze(2)
        return out
