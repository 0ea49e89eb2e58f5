"""The torch attention backend: SDPA over gathered slots (CPU, and CUDA without Triton), with
shared-prefix (cascade) attention for groups of requests that share a cached prefix.

A sliding-window layer (`forward(..., window)`) runs its own plan of the pass, built on its first
call and kept for the pass's other layers of that window: the same SDPA calls with the window in
their masks, a long extend reading only the keys its rows can see, and no cascade (every row
attends its own slots; a shared prefix mostly lies outside a short window anyway). A layer with
attention sinks (gpt-oss) runs such a plan too (windowed or not), each call through
cascade.attention_with_lse, whose softmax takes the sinks: SDPA has no term for them."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from runtime.attention.base import AttentionBackend
from runtime.attention.cascade import attention_with_lse, merge_by_lse
from runtime.forward_batch import ForwardBatch


@dataclass
class PaddedRows:
    """Short rows (decodes, drafts) padded into one [B, Q, L] attention call."""

    table: torch.Tensor  # [B, L] slots per row (padding: slot of position 0)
    q_index: torch.Tensor  # [B, Q] row of q for (request, new token j)
    dst: torch.Tensor  # token rows of q the results go to ...
    src: torch.Tensor  # ... from these rows of the flattened [B * Q] output
    mask: torch.Tensor | None  # [B, 1, Q, L]; None when every row is one token over equal lengths
    one_each: bool = False  # every row is one new token, in q's order: no q gather, no scatter
    first_row: int = 0  # with one_each: the token row of q that padded row 0 is


@dataclass
class SharedPrefix:
    """One cascade group: its members' token rows attend to `slots` together."""

    slots: torch.Tensor | slice  # a slice when the shared slots are contiguous (read in place)
    token_rows: torch.Tensor  # [N] rows of q of all members' new tokens


def pad_rows(rows: list[tuple[int, int, torch.Tensor]], device: torch.device, window: int = 0) -> PaddedRows:
    """rows: (offset of its first new token, new tokens, slots to attend to); `window` > 0: each
    token sees only the last `window` positions up to its own."""
    b = len(rows)
    max_q = max(ext for _, ext, _ in rows)
    max_len = max(s.numel() for _, _, s in rows)
    table = torch.zeros(b, max_len, dtype=torch.int64)
    q_index = torch.zeros(b, max_q, dtype=torch.int64)
    # mask[i, 0, j, p]: new token j of request i sees position p (bottom-right causal); padded
    # query rows see position 0 only (their output is dropped), so no row is all -inf.
    mask = torch.zeros(b, 1, max_q, max_len, dtype=torch.bool)
    mask[:, 0, :, 0] = True
    dst, src = [], []
    positions = torch.arange(max_len)
    for i, (start, ext, slots) in enumerate(rows):
        n = slots.numel()
        table[i, :n] = slots
        table[i, n:] = slots[0]
        q_index[i, :ext] = torch.arange(start, start + ext)
        q_pos = torch.arange(n - ext, n).unsqueeze(1)
        mask[i, 0, :ext] = positions.unsqueeze(0) <= q_pos
        if window > 0:
            mask[i, 0, :ext] &= positions.unsqueeze(0) > q_pos - window
        dst.extend(range(start, start + ext))
        src.extend(range(i * max_q, i * max_q + ext))
    # one token each over equal lengths needs no mask (the common steady decode batch)
    uniform = max_q == 1 and all(s.numel() == max_len for _, _, s in rows) and not 0 < window < max_len
    one_each = max_q == 1 and dst == list(range(rows[0][0], rows[0][0] + b))
    return PaddedRows(
        table.to(device),
        q_index.to(device),
        torch.tensor(dst, dtype=torch.int64, device=device),
        torch.tensor(src, dtype=torch.int64, device=device),
        None if uniform else mask.to(device),
        one_each,
        rows[0][0],
    )


def in_place(slots: torch.Tensor) -> torch.Tensor | slice:
    """A slice for a contiguous run of slots (indexing the pool with it is a view, not a copy)."""
    first = int(slots[0])
    if int(slots[-1]) - first == slots.numel() - 1 and bool((slots.diff() == 1).all()):
        return slice(first, first + slots.numel())
    return slots


class TorchAttentionBackend(AttentionBackend):
    """SDPA per long extend (a prompt chunk: compute-bound, one call each) and one padded SDPA for
    every short row: decodes and the few tokens of a jump-forward draft being verified. Running
    short extends one by one would cost a Python-level SDPA call per request per layer, which on
    a CPU costs more than their arithmetic; padded together they are one call per layer.

    Short rows in a prefix group (ForwardBatch.prefix_groups) attend to their own suffix in a
    second padded call that also returns the log-sum-exp; each group's members attend to the
    shared prefix in one matmul, and the two halves are merged."""

    name = "torch"
    supports_prefix_groups = True
    supports_sinks = True
    # Extends up to this many tokens join the padded call (a draft is at most
    # EngineConfig.max_jump_forward_tokens + 1 tokens; prompt chunks are longer).
    max_short_extend = 65

    def prepare(self, batch: ForwardBatch) -> None:
        self.batch = batch
        # a (window, sinks) layer kind's own plan (module docstring)
        self.windowed: dict[tuple[int, bool], TorchAttentionBackend] = {}
        # Indices and masks live where the model runs (SDPA wants its mask on q's device).
        device = batch.input_ids.device
        shared_len = {i: g.shared_len for g in batch.prefix_groups for i in g.members}
        offsets = [0]
        for ext in batch.extend_lens:
            offsets.append(offsets[-1] + ext)
        self.extends: list[tuple[int, int, torch.Tensor, torch.Tensor | None]] = []
        short: list[tuple[int, int, torch.Tensor]] = []  # (offset, new tokens, slots)
        suffixes: list[tuple[int, int, torch.Tensor]] = []  # the same, for group members' suffixes
        for i, (ext, seq, slots) in enumerate(zip(batch.extend_lens, batch.seq_lens, batch.slot_rows)):
            offset = offsets[i]
            if i in shared_len:
                suffixes.append((offset, ext, slots[shared_len[i] :]))
            elif ext <= self.max_short_extend:
                short.append((offset, ext, slots))
            else:
                # Bottom-right aligned causal mask: new token i sees positions <= prefix + i.
                mask = None
                if seq != ext:
                    q_pos = torch.arange(seq - ext, seq, device=device).unsqueeze(1)
                    mask = torch.arange(seq, device=device).unsqueeze(0) <= q_pos
                self.extends.append((offset, ext, slots.to(device), mask))
        self.short = pad_rows(short, device) if short else None
        self.suffix = pad_rows(suffixes, device) if suffixes else None
        self.shared = []
        for g in batch.prefix_groups:
            rows = [t for i in g.members for t in range(offsets[i], offsets[i + 1])]
            slots = in_place(batch.slot_rows[g.members[0]][: g.shared_len])
            self.shared.append(
                SharedPrefix(
                    slots if isinstance(slots, slice) else slots.to(device),
                    torch.tensor(rows, dtype=torch.int64, device=device),
                )
            )

    def prepare_window(self, batch: ForwardBatch, window: int) -> None:
        """The plan of a sliding-window layer (or, window 0, of a global layer with sinks): no
        cascade, the window in every mask, and a long extend's keys cut to those its first row can see."""
        device = batch.input_ids.device
        self.batch, self.windowed, self.shared, self.suffix = batch, {}, [], None
        self.extends, short, offset = [], [], 0
        for ext, seq, slots in zip(batch.extend_lens, batch.seq_lens, batch.slot_rows):
            if ext <= self.max_short_extend:
                short.append((offset, ext, slots))
            else:
                first = max(0, seq - ext - window + 1) if window > 0 else 0  # the first position any row sees
                q_pos = torch.arange(seq - ext, seq, device=device).unsqueeze(1)
                k_pos = torch.arange(first, seq, device=device).unsqueeze(0)
                mask = (k_pos <= q_pos) & ((k_pos > q_pos - window) if window > 0 else True)
                self.extends.append((offset, ext, slots[first:].to(device), mask))
            offset += ext
        self.short = pad_rows(short, device, window) if short else None

    def forward(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        window: int = 0,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if window > 0 or sinks is not None:
            plan = self.windowed.get((window, sinks is not None))
            if plan is None:
                plan = self.windowed[(window, sinks is not None)] = TorchAttentionBackend()
                plan.prepare_window(self.batch, window)
            return plan.run(q, k_cache, v_cache, sinks)
        return self.run(q, k_cache, v_cache)

    def run(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, sinks: torch.Tensor | None = None
    ) -> torch.Tensor:
        """This plan's attention (`sinks`: only in a plan without cascade, prepare_window's)."""
        out = torch.empty_like(q)
        for start, ext, slots, mask in self.extends:
            qe = q[start : start + ext].transpose(0, 1)  # [H, E, D]
            k = k_cache[slots].transpose(0, 1)  # [KVH, L, D]
            v = v_cache[slots].transpose(0, 1)
            if mask is None and sinks is not None:  # a whole prompt: plain causal
                mask = torch.ones(ext, ext, dtype=torch.bool, device=q.device).tril()
            o = _attention(qe.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), mask, mask is None, sinks)
            out[start : start + ext] = o[0].transpose(0, 1)
        if self.short is not None:
            p = self.short
            qs, k, v = self.gather(p, q, k_cache, v_cache)
            o = _attention(qs, k, v, p.mask, False, sinks)
            if p.one_each:  # a decode batch: row i of the output is token row first_row + i
                out[p.first_row : p.first_row + o.shape[0]] = o.transpose(1, 2).reshape(-1, q.shape[1], q.shape[2])
            else:
                out[p.dst] = o.transpose(1, 2).reshape(-1, q.shape[1], q.shape[2])[p.src]
        if self.suffix is not None:
            self.cascade(q, k_cache, v_cache, out)
        return out

    @staticmethod
    def gather(p: PaddedRows, q, k_cache, v_cache) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        # index_select on a flat index: a row copy, several times cheaper per call than advanced
        # indexing with the [B, L] table (which a decode step pays twice per layer)
        b, length = p.table.shape
        flat = p.table.view(-1)
        if p.one_each:
            qs = q[p.first_row : p.first_row + b].unsqueeze(1).transpose(1, 2)  # [B, H, 1, D], a view
        else:
            qs = q[p.q_index].transpose(1, 2)  # [B, H, Q, D]
        k = k_cache.index_select(0, flat).view(b, length, *k_cache.shape[1:]).transpose(1, 2)  # [B, KVH, L, D]
        v = v_cache.index_select(0, flat).view(b, length, *v_cache.shape[1:]).transpose(1, 2)
        return qs, k, v

    def cascade(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, out: torch.Tensor) -> None:
        """Group members: suffixes (one padded call with LSE), then each shared prefix (one matmul
        for all its members' tokens), merged into `out`."""
        p = self.suffix
        h, d = q.shape[1], q.shape[2]
        o, lse = attention_with_lse(*self.gather(p, q, k_cache, v_cache), mask=p.mask)
        suffix_out = torch.empty_like(q)
        suffix_lse = torch.empty(q.shape[0], h, dtype=torch.float32, device=q.device)
        suffix_out[p.dst] = o.transpose(1, 2).reshape(-1, h, d)[p.src]
        suffix_lse[p.dst] = lse.transpose(1, 2).reshape(-1, h)[p.src]
        for g in self.shared:
            qg = q[g.token_rows].transpose(0, 1).unsqueeze(0)  # [1, H, N, D]
            k = k_cache[g.slots].transpose(0, 1).unsqueeze(0)  # [1, KVH, S, D]
            v = v_cache[g.slots].transpose(0, 1).unsqueeze(0)
            o, lse = attention_with_lse(qg, k, v)
            out[g.token_rows] = merge_by_lse(
                o[0].transpose(0, 1), lse[0].transpose(0, 1), suffix_out[g.token_rows], suffix_lse[g.token_rows]
            )


def _attention(q, k, v, mask: torch.Tensor | None, causal: bool, sinks: torch.Tensor | None) -> torch.Tensor:
    """SDPA ([B, H, Q, D] against [B, KVH, L, D]; `mask` [Q, L] or [B, 1, Q, L]), or with `sinks`
    the same attention through attention_with_lse, whose softmax takes them."""
    if sinks is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=True)
    if mask is not None and mask.dim() == 2:
        mask = mask.view(1, 1, *mask.shape)
    return attention_with_lse(q, k, v, mask, sinks)[0]
