"""Attention over the slot-based KV pool. One interface, two backends (torch here; Triton for CUDA).

Each request's new tokens attend to all of its slots (cached prefix + themselves), causally.
`prepare` runs once per forward pass and builds the gather indices and masks that every layer reuses.
"""

from __future__ import annotations

import importlib.util
import os
from abc import ABC, abstractmethod

import torch
import torch.nn.functional as F

from runtime.forward_batch import ForwardBatch


class AttentionBackend(ABC):
    name = "abstract"

    @abstractmethod
    def prepare(self, batch: ForwardBatch) -> None:
        """Precompute per-pass metadata (called once before the layers run)."""

    @abstractmethod
    def forward(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
        """q: [T, H, D]; caches: [num_slots, KVH, D] (this pass's K/V already written) -> [T, H, D]."""


class TorchAttentionBackend(AttentionBackend):
    """SDPA per extend request (long, compute-bound) and one padded SDPA for all decode rows."""

    name = "torch"

    def prepare(self, batch: ForwardBatch) -> None:
        # Indices and masks live where the model runs (SDPA wants its mask on q's device).
        device = batch.input_ids.device
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
                    q_pos = torch.arange(seq - ext, seq, device=device).unsqueeze(1)
                    mask = torch.arange(seq, device=device).unsqueeze(0) <= q_pos
                self.extends.append((offset, ext, slots.to(device), mask))
            offset += ext
        self.decode_rows = torch.tensor(decode_rows, dtype=torch.int64, device=device)
        if decode_slots:
            max_len = max(s.numel() for s in decode_slots)
            table = torch.zeros(len(decode_slots), max_len, dtype=torch.int64)
            mask = torch.zeros(len(decode_slots), 1, 1, max_len, dtype=torch.bool)
            for i, s in enumerate(decode_slots):
                table[i, : s.numel()] = s
                mask[i, 0, 0, : s.numel()] = True
            self.decode_table, self.decode_mask = table.to(device), mask.to(device)
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


ATTENTION_BACKENDS = ("auto", "torch", "triton")


def triton_interpreter_enabled() -> bool:
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("1", "true", "yes", "on")


def make_attention_backend(name: str, device: torch.device) -> AttentionBackend:
    """`auto`: Triton on CUDA (when triton is installed), torch elsewhere. `triton` off CUDA runs
    only under the Triton interpreter (`TRITON_INTERPRET=1`, for tests)."""
    if name not in ATTENTION_BACKENDS:
        raise ValueError(f"attention_backend: must be one of {', '.join(ATTENTION_BACKENDS)}, not {name!r}")
    if name == "auto":
        name = "triton" if device.type == "cuda" and importlib.util.find_spec("triton") is not None else "torch"
    if name == "torch":
        return TorchAttentionBackend()
    if device.type != "cuda" and not triton_interpreter_enabled():
        raise ValueError(f"attention_backend=triton needs a CUDA device, not {device.type} "
                         "(on CPU it runs only under TRITON_INTERPRET=1, for tests)")
    from runtime.triton_attention import TritonAttentionBackend

    return TritonAttentionBackend()
