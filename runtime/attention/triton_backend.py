"""Triton attention over the slot-based KV pool (the CUDA backend; anchor: SGLang
`layers/attention/triton_ops/extend_attention.py` and `decode_attention.py`).

Two kernels, both reading K/V through a padded slot table `[B, max_len]` (row b, column i = slot of
request b's position i), so no request ever has a contiguous copy of its KV:

- extend: the new tokens of a request (packed back to back in `q`, as in `ForwardBatch`) attend to
  the request's cached prefix and to themselves, causally, bottom-right aligned: new token i sees
  positions <= prefix + i. One program per (request, query head, block of new tokens); key blocks
  past the block's last position are never visited.
- decode: one new token per request. One program per (request, block of query heads that share a
  KV head, KV split): grouped-query heads share each K/V tile they load, and long contexts are split
  over the KV length (split-K / flash-decoding); a second kernel merges the splits by their
  log-sum-exp.
- shared prefix (cascade): decode requests holding the same cached prefix slots
  (ForwardBatch.prefix_groups) read them once per layer for all of them. One program per (task of
  up to MEMBERS members (prefix_config), KV head, prefix split) multiplies every member's query heads of
  that KV head by each prefix K/V tile it loads; the split-K decode kernel then covers only each
  member's own positions, and the merge kernel folds the prefix partials in with the rest (the
  same log-sum-exp merge as split-K, so no extra pass). Extends in a group (jump-forward drafts,
  prompt chunks) take the extend kernel over their whole row.

The K/V of this pass are already in the pool when `forward` runs (the model writes them first), so
the extend kernel reads every key, cached or new, from the pool.

Tested on CPU under `TRITON_INTERPRET=1`. The interpreter keeps bfloat16 as raw 16-bit integers
and has no bfloat16 arithmetic, so on CPU bfloat16 tiles are widened to float32 right after loading
(`UPCAST`); on CUDA they stay bfloat16 into `tl.dot`.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from runtime.attention.base import AttentionBackend
from runtime.forward_batch import ForwardBatch, PrefixGroup


@triton.jit
def _dot(a, b, IEEE: tl.constexpr):
    # float32 K/V: exact products like the torch reference, not TF32.
    if IEEE:
        return tl.dot(a, b, input_precision="ieee")
    else:
        return tl.dot(a, b)


@triton.jit
def _load_keys(
    K, Table, req, offs_n, mask_n, kv_head, offs_d, mask_d, stride_tb, stride_kt, stride_kh, UPCAST: tl.constexpr
):
    """The slots of key positions `offs_n` of request `req`, and their keys as a [D, N] tile."""
    slot = tl.load(Table + req * stride_tb + offs_n, mask=mask_n, other=0).to(tl.int64)
    k = tl.load(
        K + slot[None, :] * stride_kt + kv_head * stride_kh + offs_d[:, None],
        mask=mask_n[None, :] & mask_d[:, None],
        other=0.0,
    )
    if UPCAST:
        k = k.to(tl.float32)
    return slot, k


@triton.jit
def _accumulate(
    acc,
    l_i,
    m_i,
    m_new,
    s,
    V,
    slot,
    mask_n,
    kv_head,
    offs_d,
    mask_d,
    stride_vt,
    stride_vh,
    UPCAST: tl.constexpr,
    IEEE: tl.constexpr,
):
    """One online-softmax step over a key tile: rescale the running sums to the new row maxima
    `m_new`, then add the tile's exp(scores) and their weighted values (a [N, D] tile)."""
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    v = tl.load(
        V + slot[:, None] * stride_vt + kv_head * stride_vh + offs_d[None, :],
        mask=mask_n[:, None] & mask_d[None, :],
        other=0.0,
    )
    if UPCAST:
        v = v.to(tl.float32)
    acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, IEEE)
    return acc, l_i


@triton.jit
def _split_len(length, n_splits, BLOCK_N: tl.constexpr):
    """Positions per split when `length` positions are cut into `n_splits` splits of whole BLOCK_N
    tiles (trailing splits of a short span may be empty). The split kernels and the merge kernel
    apply it alike, so the merge skips exactly the splits that wrote nothing; 0 splits is none."""
    return tl.cdiv(tl.cdiv(length, tl.maximum(n_splits, 1)), BLOCK_N) * BLOCK_N


@triton.jit
def _attend_span(
    q,
    start,
    end,
    K,
    V,
    Table,
    req,
    kv_head,
    offs_d,
    mask_d,
    sm_scale,
    stride_tb,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    ROWS: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    UPCAST: tl.constexpr,
    IEEE: tl.constexpr,
):
    """Online softmax of q's ROWS rows over key positions [start, end) of request `req`'s slot
    row, every key visible: (unnormalised output, row sums, row maxima)."""
    m_i = tl.zeros([ROWS], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([ROWS], dtype=tl.float32)
    acc = tl.zeros([ROWS, BLOCK_D], dtype=tl.float32)
    offs_n0 = tl.arange(0, BLOCK_N)
    for start_n in range(start, end, BLOCK_N):
        offs_n = start_n + offs_n0
        mask_n = offs_n < end
        slot, k = _load_keys(
            K, Table, req, offs_n, mask_n, kv_head, offs_d, mask_d, stride_tb, stride_kt, stride_kh, UPCAST
        )
        s = _dot(q, k.to(q.dtype), IEEE) * sm_scale
        s = tl.where(mask_n[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        acc, l_i = _accumulate(
            acc, l_i, m_i, m_new, s, V, slot, mask_n, kv_head, offs_d, mask_d, stride_vt, stride_vh, UPCAST, IEEE
        )
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def extend_kernel(
    Q,
    K,
    V,
    O,
    QStart,
    ExtLen,
    SeqLen,
    Table,
    sm_scale,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_ot,
    stride_oh,
    stride_tb,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    UPCAST: tl.constexpr,
    IEEE: tl.constexpr,
):
    req = tl.program_id(0)
    head = tl.program_id(1)
    mblk = tl.program_id(2)
    ext = tl.load(ExtLen + req)
    if mblk * BLOCK_M < ext:  # the grid covers the longest extend; shorter ones skip the rest
        seq = tl.load(SeqLen + req)
        prefix = seq - ext
        q_start = tl.load(QStart + req).to(tl.int64)
        kv_head = head // GROUP

        offs_m = mblk * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        offs_n0 = tl.arange(0, BLOCK_N)
        mask_m = offs_m < ext
        mask_d = offs_d < HEAD_DIM

        q = tl.load(
            Q + (q_start + offs_m[:, None]) * stride_qt + head * stride_qh + offs_d[None, :],
            mask=mask_m[:, None] & mask_d[None, :],
            other=0.0,
        )
        if UPCAST:
            q = q.to(tl.float32)

        m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        q_pos = prefix + offs_m  # absolute position of each query row
        kv_end = tl.minimum(seq, prefix + (mblk + 1) * BLOCK_M)  # causal: nothing past the block's last row
        for start_n in range(0, kv_end, BLOCK_N):
            offs_n = start_n + offs_n0
            mask_n = offs_n < kv_end
            slot, k = _load_keys(
                K, Table, req, offs_n, mask_n, kv_head, offs_d, mask_d, stride_tb, stride_kt, stride_kh, UPCAST
            )
            s = _dot(q, k.to(q.dtype), IEEE) * sm_scale
            keep = (q_pos[:, None] >= offs_n[None, :]) & mask_n[None, :]
            s = tl.where(keep, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            # Padded query rows see only -inf: keep them finite so no NaN is ever produced.
            m_new = tl.where(mask_m, m_new, 0.0)
            acc, l_i = _accumulate(
                acc, l_i, m_i, m_new, s, V, slot, mask_n, kv_head, offs_d, mask_d, stride_vt, stride_vh, UPCAST, IEEE
            )
            m_i = m_new
        out = acc / tl.where(mask_m, l_i, 1.0)[:, None]
        tl.store(
            O + (q_start + offs_m[:, None]) * stride_ot + head * stride_oh + offs_d[None, :],
            out,
            mask=mask_m[:, None] & mask_d[None, :],
        )


@triton.jit
def decode_split_kernel(
    Q,
    K,
    V,
    MidO,
    MidLse,
    QRows,
    SeqLen,
    KvStart,
    NumSplits,
    Table,
    sm_scale,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_tb,
    stride_mb,
    stride_mh,
    stride_ms,
    stride_lb,
    stride_lh,
    GROUP: tl.constexpr,
    HEADS_PER_PROG: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    UPCAST: tl.constexpr,
    IEEE: tl.constexpr,
):
    req = tl.program_id(0)
    hblk = tl.program_id(1)
    split = tl.program_id(2)
    seq = tl.load(SeqLen + req)
    kv0 = tl.load(KvStart + req)  # positions before it are a shared prefix (prefix_split_kernel)
    n_splits = tl.load(NumSplits + req)
    per_split = _split_len(seq - kv0, n_splits, BLOCK_N)
    start = kv0 + split * per_split
    end = tl.minimum(start + per_split, seq)
    if (split < n_splits) & (end > start):
        row = tl.load(QRows + req).to(tl.int64)
        first_head = hblk * HEADS_PER_PROG
        kv_head = first_head // GROUP
        offs_h = tl.arange(0, BLOCK_H)
        heads = first_head + offs_h
        mask_h = offs_h < HEADS_PER_PROG  # tl.dot wants >= 16 rows: the head group is padded
        offs_d = tl.arange(0, BLOCK_D)
        mask_d = offs_d < HEAD_DIM

        q = tl.load(
            Q + row * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
            mask=mask_h[:, None] & mask_d[None, :],
            other=0.0,
        )
        if UPCAST:
            q = q.to(tl.float32)
        acc, l_i, m_i = _attend_span(
            q,
            start,
            end,
            K,
            V,
            Table,
            req,
            kv_head,
            offs_d,
            mask_d,
            sm_scale,
            stride_tb,
            stride_kt,
            stride_kh,
            stride_vt,
            stride_vh,
            BLOCK_H,
            BLOCK_D,
            BLOCK_N,
            UPCAST,
            IEEE,
        )
        mid = req * stride_mb + heads * stride_mh + split * stride_ms
        tl.store(MidO + mid[:, None] + offs_d[None, :], acc / l_i[:, None], mask=mask_h[:, None] & mask_d[None, :])
        tl.store(MidLse + req * stride_lb + heads * stride_lh + split, m_i + tl.log(l_i), mask=mask_h)


@triton.jit
def prefix_split_kernel(
    Q,
    K,
    V,
    MidO,
    MidLse,
    QRows,
    Members,
    SharedLen,
    NumSplits,
    Table,
    sm_scale,
    prefix_col,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_tb,
    stride_pm,
    stride_mb,
    stride_mh,
    stride_ms,
    stride_lb,
    stride_lh,
    GROUP: tl.constexpr,
    MEMBERS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
    UPCAST: tl.constexpr,
    IEEE: tl.constexpr,
):
    """Partial attention of up to MEMBERS decode requests (Members[task], -1 padded) over the
    first SharedLen[task] positions of the first member's row, which they all share: row r of the
    query tile is member r // GROUP's query head kv_head * GROUP + r % GROUP. Written at split
    column prefix_col + split, as the split-K kernel writes its own."""
    task = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    shared = tl.load(SharedLen + task)
    n_splits = tl.load(NumSplits + task)  # 0: an unused task of a CUDA graph's fixed grid
    per_split = _split_len(shared, n_splits, BLOCK_N)
    start = split * per_split
    end = tl.minimum(start + per_split, shared)
    if (split < n_splits) & (end > start):
        offs_r = tl.arange(0, BLOCK_R)
        member_i = offs_r // GROUP
        member = tl.load(Members + task * stride_pm + member_i, mask=member_i < MEMBERS, other=-1)
        mask_r = (member_i < MEMBERS) & (member >= 0)
        heads = kv_head * GROUP + offs_r % GROUP
        owner = tl.load(Members + task * stride_pm)  # its row of the slot table holds the prefix
        offs_d = tl.arange(0, BLOCK_D)
        mask_d = offs_d < HEAD_DIM
        row = tl.load(QRows + member, mask=mask_r, other=0).to(tl.int64)
        q = tl.load(
            Q + row[:, None] * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
            mask=mask_r[:, None] & mask_d[None, :],
            other=0.0,
        )
        if UPCAST:
            q = q.to(tl.float32)
        acc, l_i, m_i = _attend_span(
            q,
            start,
            end,
            K,
            V,
            Table,
            owner,
            kv_head,
            offs_d,
            mask_d,
            sm_scale,
            stride_tb,
            stride_kt,
            stride_kh,
            stride_vt,
            stride_vh,
            BLOCK_R,
            BLOCK_D,
            BLOCK_N,
            UPCAST,
            IEEE,
        )
        safe = tl.where(mask_r, member, 0).to(tl.int64)
        mid = safe * stride_mb + heads * stride_mh + (prefix_col + split) * stride_ms
        tl.store(MidO + mid[:, None] + offs_d[None, :], acc / l_i[:, None], mask=mask_r[:, None] & mask_d[None, :])
        tl.store(MidLse + safe * stride_lb + heads * stride_lh + prefix_col + split, m_i + tl.log(l_i), mask=mask_r)


@triton.jit
def _merge_split(acc, total, m, MidO, MidLse, mid_o, mid_lse, offs_d, mask_d):
    """Fold one split's partial output (weight exp(lse)) into the running merge."""
    lse = tl.load(MidLse + mid_lse)
    o = tl.load(MidO + mid_o + offs_d, mask=mask_d, other=0.0)
    m_new = tl.maximum(m, lse)
    scale = tl.exp(m - m_new)
    w = tl.exp(lse - m_new)
    return acc * scale + w * o, total * scale + w, m_new


@triton.jit
def decode_merge_kernel(
    MidO,
    MidLse,
    O,
    QRows,
    SeqLen,
    KvStart,
    NumSplits,
    PrefixSplits,
    prefix_col,
    stride_mb,
    stride_mh,
    stride_ms,
    stride_lb,
    stride_lh,
    stride_ot,
    stride_oh,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    req = tl.program_id(0)
    head = tl.program_id(1)
    seq = tl.load(SeqLen + req)
    kv0 = tl.load(KvStart + req)
    n_splits = tl.load(NumSplits + req)
    n_prefix = tl.load(PrefixSplits + req)
    row = tl.load(QRows + req).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM
    m = -float("inf")
    total = 0.0
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    o_base = req * stride_mb + head * stride_mh
    l_base = req * stride_lb + head * stride_lh
    # the splits' emptiness rule (_split_len), as decode_split_kernel and prefix_split_kernel cut them
    per_split = _split_len(seq - kv0, n_splits, BLOCK_N)
    for split in range(0, n_splits):
        if split * per_split < seq - kv0:
            acc, total, m = _merge_split(
                acc, total, m, MidO, MidLse, o_base + split * stride_ms, l_base + split, offs_d, mask_d
            )
    per_prefix = _split_len(kv0, n_prefix, BLOCK_N)
    for split in range(0, n_prefix):
        if split * per_prefix < kv0:
            col = prefix_col + split
            acc, total, m = _merge_split(
                acc, total, m, MidO, MidLse, o_base + col * stride_ms, l_base + col, offs_d, mask_d
            )
    tl.store(O + row * stride_ot + head * stride_oh + offs_d, acc / total, mask=mask_d)


# ---------------------------------------------------------------------------------------- launchers


@dataclass
class ExtendMetadata:
    """Requests with several new tokens. Index tensors live on the KV pool's device."""

    q_start: torch.Tensor  # int32 [B] first row of each request's new tokens in q
    ext_lens: torch.Tensor  # int32 [B] new tokens
    seq_lens: torch.Tensor  # int32 [B] cached prefix + new tokens
    slot_table: torch.Tensor  # int32 [B, >= max seq_len] slot of each position
    max_ext: int


@dataclass
class PrefixTasks:
    """Shared prefixes of decode requests (cascade), as prefix_split_kernel's tasks."""

    members: torch.Tensor  # int32 [T, MEMBERS] decode indices (-1: none); the first one's row holds the prefix
    shared_lens: torch.Tensor  # int32 [T]
    num_splits: torch.Tensor  # int32 [T] prefix splits per task, 1..max_splits
    max_splits: int  # grid size over prefix splits


@dataclass
class DecodeMetadata:
    """Requests with one new token each."""

    q_rows: torch.Tensor  # int32 [B] row of each request's token in q (and in the output)
    seq_lens: torch.Tensor  # int32 [B]
    slot_table: torch.Tensor  # int32 [B, >= max seq_len]
    num_splits: torch.Tensor | None  # int32 [B] KV splits per request, 1..max_splits (None: not yet sized)
    max_splits: int  # grid size over splits (fixed for a CUDA graph)
    # Cascade: where each request's own positions start (0: no shared prefix) and how many prefix
    # splits its merge folds in (0: none); `prefix` the tasks that compute those (None: no groups).
    kv_start: torch.Tensor  # int32 [B]
    prefix_splits: torch.Tensor | None  # int32 [B] (None: not yet sized)
    prefix: PrefixTasks | None = None


@functools.lru_cache(maxsize=256)
def decode_head_blocks(num_heads: int, num_kv_heads: int) -> tuple[int, int, int]:
    """(query heads per decode program, programs per request, padded head rows for tl.dot)."""
    if num_heads % num_kv_heads:
        raise ValueError(f"attention: {num_heads} query heads are not a multiple of {num_kv_heads} KV heads")
    group = num_heads // num_kv_heads
    per_prog = group if group <= 16 else math.gcd(group, 16)
    return per_prog, num_heads // per_prog, max(16, triton.next_power_of_2(per_prog))


def _upcast(dtype: torch.dtype, on_gpu: bool) -> bool:
    return not on_gpu and dtype == torch.bfloat16  # see the module docstring


@functools.lru_cache(maxsize=256)  # called per layer: keep the launch path short
def extend_config(
    heads: int,
    kv_heads: int,
    dim: int,
    dtype: torch.dtype,
    on_gpu: bool,
    block_m: int | None = None,
    block_n: int | None = None,
) -> dict:
    """The extend kernel's compile-time parameters and launch options."""
    if heads % kv_heads:
        raise ValueError(f"attention: {heads} query heads are not a multiple of {kv_heads} KV heads")
    wide = on_gpu and dtype != torch.float32  # float32 tiles take twice the shared memory
    return dict(
        GROUP=heads // kv_heads,
        HEAD_DIM=dim,
        BLOCK_D=max(16, triton.next_power_of_2(dim)),
        BLOCK_M=block_m or (64 if wide else 32),
        BLOCK_N=block_n or (64 if wide else 32),
        UPCAST=_upcast(dtype, on_gpu),
        IEEE=dtype == torch.float32,
        num_warps=4 if dim <= 64 else 8,
        num_stages=2,
    )


@functools.lru_cache(maxsize=256)  # called per layer: keep the launch path short
def decode_config(
    heads: int, kv_heads: int, dim: int, dtype: torch.dtype, on_gpu: bool, block_n: int | None = None
) -> tuple[int, dict, dict]:
    """(programs per request over heads, split kernel parameters, merge kernel parameters)."""
    per_prog, head_blocks, block_h = decode_head_blocks(heads, kv_heads)
    block_d = max(16, triton.next_power_of_2(dim))
    block_n = block_n or ((64 if dim <= 64 else 32) if on_gpu else 16)
    split = dict(
        GROUP=heads // kv_heads,
        HEADS_PER_PROG=per_prog,
        HEAD_DIM=dim,
        BLOCK_D=block_d,
        BLOCK_H=block_h,
        BLOCK_N=block_n,
        UPCAST=_upcast(dtype, on_gpu),
        IEEE=dtype == torch.float32,
        num_warps=4,
        num_stages=2,
    )
    merge = dict(HEAD_DIM=dim, BLOCK_D=block_d, BLOCK_N=block_n, num_warps=2)
    return head_blocks, split, merge


@functools.lru_cache(maxsize=256)
def prefix_config(
    heads: int, kv_heads: int, dim: int, dtype: torch.dtype, on_gpu: bool, block_n: int | None = None
) -> dict:
    """prefix_split_kernel's parameters: MEMBERS requests' query heads of one KV head fill a query
    tile of up to 64 rows (at least 16: tl.dot's minimum); BLOCK_N as the decode kernels' (the
    merge kernel applies the same emptiness rule to prefix splits)."""
    _, split, _ = decode_config(heads, kv_heads, dim, dtype, on_gpu, block_n)
    group = heads // kv_heads
    members = max(1, 64 // group)
    return dict(
        GROUP=group,
        MEMBERS=members,
        HEAD_DIM=dim,
        BLOCK_D=split["BLOCK_D"],
        BLOCK_R=max(16, triton.next_power_of_2(members * group)),
        BLOCK_N=split["BLOCK_N"],
        UPCAST=split["UPCAST"],
        IEEE=split["IEEE"],
        num_warps=4,
        num_stages=2,
    )


def extend_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    out: torch.Tensor,
    meta: ExtendMetadata,
    block_m: int | None = None,
    block_n: int | None = None,
) -> None:
    """Write the extend rows of `out` ([T, H, D], like q). Caches: [num_slots, KVH, D]."""
    batch = meta.ext_lens.shape[0]
    if batch == 0:
        return
    _, heads, dim = q.shape
    cfg = extend_config(heads, k_cache.shape[1], dim, q.dtype, q.device.type == "cuda", block_m, block_n)
    grid = (batch, heads, triton.cdiv(meta.max_ext, cfg["BLOCK_M"]))
    extend_kernel[grid](
        q,
        k_cache,
        v_cache,
        out,
        meta.q_start,
        meta.ext_lens,
        meta.seq_lens,
        meta.slot_table,
        1.0 / math.sqrt(dim),
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        v_cache.stride(0),
        v_cache.stride(1),
        out.stride(0),
        out.stride(1),
        meta.slot_table.stride(0),
        **cfg,
    )


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    out: torch.Tensor,
    meta: DecodeMetadata,
    block_n: int | None = None,
) -> None:
    """Write the decode rows of `out`. Launches a fixed grid with no host sync, so it can be
    captured in a CUDA graph when the metadata tensors are static buffers."""
    batch = meta.seq_lens.shape[0]
    if batch == 0:
        return
    _, heads, dim = q.shape
    on_gpu = q.device.type == "cuda"
    head_blocks, split_cfg, merge_cfg = decode_config(heads, k_cache.shape[1], dim, q.dtype, on_gpu, block_n)
    splits = meta.max_splits
    columns = splits + (meta.prefix.max_splits if meta.prefix is not None else 0)  # prefix partials after the splits
    mid_o = torch.empty(batch, heads, columns, dim, dtype=torch.float32, device=q.device)
    mid_lse = torch.empty(batch, heads, columns, dtype=torch.float32, device=q.device)
    sm_scale = 1.0 / math.sqrt(dim)
    mid_strides = (mid_o.stride(0), mid_o.stride(1), mid_o.stride(2), mid_lse.stride(0), mid_lse.stride(1))
    decode_split_kernel[(batch, head_blocks, splits)](
        q,
        k_cache,
        v_cache,
        mid_o,
        mid_lse,
        meta.q_rows,
        meta.seq_lens,
        meta.kv_start,
        meta.num_splits,
        meta.slot_table,
        sm_scale,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        v_cache.stride(0),
        v_cache.stride(1),
        meta.slot_table.stride(0),
        *mid_strides,
        **split_cfg,
    )
    if meta.prefix is not None:
        p = meta.prefix
        prefix_split_kernel[(p.members.shape[0], k_cache.shape[1], p.max_splits)](
            q,
            k_cache,
            v_cache,
            mid_o,
            mid_lse,
            meta.q_rows,
            p.members,
            p.shared_lens,
            p.num_splits,
            meta.slot_table,
            sm_scale,
            splits,
            q.stride(0),
            q.stride(1),
            k_cache.stride(0),
            k_cache.stride(1),
            v_cache.stride(0),
            v_cache.stride(1),
            meta.slot_table.stride(0),
            p.members.stride(0),
            *mid_strides,
            **prefix_config(heads, k_cache.shape[1], dim, q.dtype, on_gpu, block_n),
        )
    decode_merge_kernel[(batch, heads)](
        mid_o,
        mid_lse,
        out,
        meta.q_rows,
        meta.seq_lens,
        meta.kv_start,
        meta.num_splits,
        meta.prefix_splits,
        splits,
        *mid_strides,
        out.stride(0),
        out.stride(1),
        **merge_cfg,
    )


def num_kv_splits(seq_lens: torch.Tensor, max_splits: int, min_split_tokens: int) -> torch.Tensor:
    """Splits per request: one per `min_split_tokens` keys, at most `max_splits`. Device ops only
    (it runs inside the decode CUDA graph)."""
    return torch.clamp((seq_lens + (min_split_tokens - 1)) // min_split_tokens, 1, max_splits).to(torch.int32)


@dataclass
class PrefixPlan:
    """Shared-prefix tasks on the host: at most `per_task` members each (-1 padded)."""

    members: list[list[int]]
    shared_lens: list[int]
    task_splits: list[int]
    request_splits: list[int]  # per decode request: its task's prefix splits (0: in no group)


def plan_prefix_tasks(
    groups: list[tuple[int, list[int]]], batch: int, per_task: int, most: int, min_split_tokens: int
) -> PrefixPlan:
    """Tasks for `groups` ((shared_len, decode indices) each): members in chunks of `per_task`,
    one split per `min_split_tokens` prefix positions, at most `most`."""
    plan = PrefixPlan([], [], [], [0] * batch)
    for shared, members in groups:
        splits = min(most, max(1, -(-shared // min_split_tokens)))
        for i in range(0, len(members), per_task):
            chunk = members[i : i + per_task]
            plan.members.append(chunk + [-1] * (per_task - len(chunk)))
            plan.shared_lens.append(shared)
            plan.task_splits.append(splits)
            for m in chunk:
                plan.request_splits[m] = splits
    return plan


def own_starts(groups: list[tuple[int, list[int]]], batch: int) -> list[int]:
    """Per decode request: where its own positions start (its group's shared length; 0 in none)."""
    starts = [0] * batch
    for shared, members in groups:
        for m in members:
            starts[m] = shared
    return starts


def decode_groups(prefix_groups: list[PrefixGroup], decode_index: dict[int, int]) -> list[tuple[int, list[int]]]:
    """(shared_len, decode indices) of each prefix group's decode members (`decode_index`: batch
    index -> decode index), where at least two share the prefix (extends take the extend kernel)."""
    out = []
    for g in prefix_groups:
        members = [decode_index[i] for i in g.members if i in decode_index]
        if len(members) >= 2:
            out.append((g.shared_len, members))
    return out


def prefix_max_splits(max_kv_splits: int | None, kv_heads: int, device: torch.device) -> int:
    """Grid size over prefix splits: enough for one task's programs to give every SM about two
    (fixed per device, so eager passes and CUDA-graph replays split a prefix the same way)."""
    return max_kv_splits or default_max_splits(1, kv_heads, device)


_SM_COUNT: dict[int, int] = {}


def default_max_splits(batch: int, head_blocks: int, device: torch.device) -> int:
    """Enough split programs to give every SM about two, and no more than 16 splits."""
    if device.type != "cuda":
        return 4
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SM_COUNT:
        _SM_COUNT[index] = torch.cuda.get_device_properties(index).multi_processor_count
    want = -(-2 * _SM_COUNT[index] // max(1, batch * head_blocks))
    return int(min(16, max(1, triton.next_power_of_2(want))))


def _slot_table(rows: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    table = torch.nn.utils.rnn.pad_sequence([r.reshape(-1) for r in rows], batch_first=True)
    return table.to(dtype=torch.int32).to(device, non_blocking=True)


class TritonAttentionBackend(AttentionBackend):
    """Extend requests through the extend kernel, single-token requests through split-K decode,
    and decode requests in a prefix group through the shared-prefix kernel plus split-K decode
    over their own positions.

    `prepare` builds the int32 index tensors (request offsets, lengths, padded slot tables) once
    per pass; every layer's `forward` reuses them.
    """

    name = "triton"
    supports_prefix_groups = True
    max_short_extend = 1  # only decode requests join a prefix group (see the module docstring)
    # On the H200 (bench/results/gpu_h200_*, docs/perf-log.md) 64 decodes under a 512-token
    # prefix (32k reads saved) ran 10% slower with groups than without, the step's host work of
    # forming them outweighing the attention saved; 32 under 3k (95k saved) saved about as much
    # kernel time per step (0.28 ms over 30 layers) as that work costs. Groups form from here on.
    min_saved_prefix_reads = 128 * 1024

    def __init__(
        self,
        max_kv_splits: int | None = None,
        min_split_tokens: int = 256,
        extend_blocks: tuple[int, int] | None = None,
        decode_block_n: int | None = None,
    ):
        self.max_kv_splits = max_kv_splits  # None: sized from the batch and the GPU's SM count
        self.min_split_tokens = min_split_tokens
        self.extend_blocks = extend_blocks or (None, None)
        self.decode_block_n = decode_block_n
        self.extend: ExtendMetadata | None = None
        self.decode: DecodeMetadata | None = None
        self.groups: list[tuple[int, list[int]]] = []  # (shared_len, decode indices) until the first forward

    def prepare(self, batch: ForwardBatch) -> None:
        device = batch.input_ids.device
        ext_rows, dec_rows = [], []
        offset = 0
        for i, ext in enumerate(batch.extend_lens):
            (dec_rows if ext == 1 else ext_rows).append((i, offset))
            offset += ext
        self.extend = self.decode = None
        self.groups = []
        if ext_rows:
            idx = [i for i, _ in ext_rows]
            ext = [batch.extend_lens[i] for i in idx]
            ints = torch.tensor(
                [[o for _, o in ext_rows], ext, [batch.seq_lens[i] for i in idx]], dtype=torch.int32
            ).to(device, non_blocking=True)
            self.extend = ExtendMetadata(
                ints[0], ints[1], ints[2], _slot_table([batch.slot_rows[i] for i in idx], device), max(ext)
            )
        if dec_rows:
            idx = [i for i, _ in dec_rows]
            self.groups = decode_groups(batch.prefix_groups, {i: d for d, i in enumerate(idx)})
            ints = torch.tensor(
                [[o for _, o in dec_rows], [batch.seq_lens[i] for i in idx], own_starts(self.groups, len(idx))],
                dtype=torch.int32,
            ).to(device, non_blocking=True)
            # The split counts need the head layout, which the first `forward` brings.
            self.decode = DecodeMetadata(
                ints[0],
                ints[1],
                _slot_table([batch.slot_rows[i] for i in idx], device),
                num_splits=None,
                max_splits=0,
                kv_start=ints[2],
                prefix_splits=None,
            )

    def _size_splits(self, heads: int, kv_heads: int, dim: int, dtype: torch.dtype, device: torch.device) -> None:
        """The split counts of this pass's decode requests and their shared-prefix tasks."""
        d = self.decode
        _, head_blocks, _ = decode_head_blocks(heads, kv_heads)
        # Sized for the batch rounded up to a power of two, as the decode CUDA graphs are,
        # so eager and replayed passes split the same way.
        d.max_splits = self.max_kv_splits or default_max_splits(
            triton.next_power_of_2(d.seq_lens.shape[0]), head_blocks, device
        )
        d.num_splits = num_kv_splits(d.seq_lens - d.kv_start, d.max_splits, self.min_split_tokens)
        if not self.groups:
            d.prefix_splits = torch.zeros_like(d.kv_start)
            return
        per_task = prefix_config(heads, kv_heads, dim, dtype, device.type == "cuda", self.decode_block_n)["MEMBERS"]
        most = prefix_max_splits(self.max_kv_splits, kv_heads, device)
        plan = plan_prefix_tasks(self.groups, d.seq_lens.shape[0], per_task, most, self.min_split_tokens)
        ints = torch.tensor([plan.shared_lens, plan.task_splits], dtype=torch.int32).to(device)
        d.prefix = PrefixTasks(torch.tensor(plan.members, dtype=torch.int32).to(device), ints[0], ints[1], most)
        d.prefix_splits = torch.tensor(plan.request_splits, dtype=torch.int32).to(device)

    def forward(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(q)
        if self.extend is not None:
            bm, bn = self.extend_blocks
            extend_attention(q, k_cache, v_cache, out, self.extend, bm, bn)
        if self.decode is not None:
            if self.decode.num_splits is None:
                self._size_splits(q.shape[1], k_cache.shape[1], q.shape[2], q.dtype, q.device)
            decode_attention(q, k_cache, v_cache, out, self.decode, self.decode_block_n)
        return out
