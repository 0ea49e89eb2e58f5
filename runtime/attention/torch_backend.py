"""The torch attention backend: SDPA over gathered slots (CPU, and CUDA without Triton)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from runtime.attention.base import AttentionBackend
from runtime.forward_batch import ForwardBatch


class TorchAttentionBackend(AttentionBackend):
    """SDPA per long extend (a prompt chunk: compute-bound, one call each) and one padded SDPA for
    every short row: decodes and the few tokens of a jump-forward draft being verified. Running
    short extends one by one would cost a Python-level SDPA call per request per layer, which on
    a CPU costs more than their arithmetic; padded together they are one call per layer."""

    name = "torch"
    # Extends up to this many tokens join the padded call (a draft is at most
    # EngineConfig.max_jump_forward_tokens + 1 tokens; prompt chunks are longer).
    max_short_extend = 65

    def prepare(self, batch: ForwardBatch) -> None:
        # Indices and masks live where the model runs (SDPA wants its mask on q's device).
        device = batch.input_ids.device
        self.extends: list[tuple[int, int, torch.Tensor, torch.Tensor | None]] = []
        short: list[tuple[int, int, torch.Tensor]] = []  # (offset, new tokens, slots)
        offset = 0
        for ext, seq, slots in zip(batch.extend_lens, batch.seq_lens, batch.slot_rows):
            if ext <= self.max_short_extend:
                short.append((offset, ext, slots))
            else:
                # Bottom-right aligned causal mask: new token i sees positions <= prefix + i.
                mask = None
                if seq != ext:
                    q_pos = torch.arange(seq - ext, seq, device=device).unsqueeze(1)
                    mask = torch.arange(seq, device=device).unsqueeze(0) <= q_pos
                self.extends.append((offset, ext, slots.to(device), mask))
            offset += ext
        self.short = bool(short)
        if not short:
            return
        b = len(short)
        max_q = max(ext for _, ext, _ in short)
        max_len = max(s.numel() for _, _, s in short)
        table = torch.zeros(b, max_len, dtype=torch.int64)
        q_index = torch.zeros(b, max_q, dtype=torch.int64)  # row of q for (request, new token j)
        # mask[i, 0, j, p]: new token j of request i sees position p (bottom-right causal); padded
        # query rows see position 0 only (their output is dropped), so no row is all -inf.
        mask = torch.zeros(b, 1, max_q, max_len, dtype=torch.bool)
        mask[:, 0, :, 0] = True
        dst, src = [], []
        positions = torch.arange(max_len)
        for i, (start, ext, slots) in enumerate(short):
            n = slots.numel()
            table[i, :n] = slots
            q_index[i, :ext] = torch.arange(start, start + ext)
            mask[i, 0, :ext] = positions.unsqueeze(0) <= torch.arange(n - ext, n).unsqueeze(1)
            dst.extend(range(start, start + ext))
            src.extend(range(i * max_q, i * max_q + ext))
        self.short_table, self.short_q_index = table.to(device), q_index.to(device)
        self.short_dst = torch.tensor(dst, dtype=torch.int64, device=device)
        self.short_src = torch.tensor(src, dtype=torch.int64, device=device)
        # one token each over equal lengths needs no mask (the common steady decode batch)
        uniform = max_q == 1 and all(s.numel() == max_len for _, _, s in short)
        self.short_mask = None if uniform else mask.to(device)

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
        if self.short:
            qs = q[self.short_q_index].transpose(1, 2)  # [B, H, Q, D]
            k = k_cache[self.short_table].transpose(1, 2)  # [B, KVH, L, D]
            v = v_cache[self.short_table].transpose(1, 2)
            o = F.scaled_dot_product_attention(qs, k, v, attn_mask=self.short_mask, enable_gqa=True)
            out[self.short_dst] = o.transpose(1, 2).reshape(-1, q.shape[1], q.shape[2])[self.short_src]
        return out
