"""The Triton attention kernels over the slot-based KV pool (the CUDA backend; anchor: SGLang
`layers/attention/triton_ops/extend_attention.py` and `decode_attention.py`).

Two kernels, both reading K/V through a padded slot table `[B, max_len]` (row b, column i = slot of
request b's position i), so no request ever has a contiguous copy of its KV:

- extend: the new tokens of a request (packed back to back in `q`, as in `ForwardBatch`) attend to
  the request's cached prefix and to themselves, causally, bottom-right aligned: new token i sees
  positions <= prefix + i (and, in a sliding-window layer, > prefix + i - window; key blocks
  before the block's first row's window are skipped). One program per (request, query head, block of new tokens); key blocks
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
  prompt chunks) take the extend kernel over their whole row. A sliding-window layer's decode takes
  no prefix kernel: each request's own positions start at seq - window (KvStart), which the split
  and merge kernels already honour.
- attention sinks (gpt-oss, HAS_SINKS): each extend row's and each decode merge's start (max = sink, sum = 1).

The K/V of this pass are already in the pool when `forward` runs (the model writes them first), so
the extend kernel reads every key, cached or new, from the pool.

Tested on CPU under `TRITON_INTERPRET=1`. The interpreter keeps bfloat16 as raw 16-bit integers
and has no bfloat16 arithmetic, so on CPU bfloat16 tiles are widened to float32 right after loading
(`UPCAST`); on CUDA they stay bfloat16 into `tl.dot`.
"""

from __future__ import annotations

import triton
import triton.language as tl

NO_WINDOW = 1 << 30  # the extend kernel's window for a global layer: more positions than any row sees


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
    Sinks,
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
    window,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    UPCAST: tl.constexpr,
    IEEE: tl.constexpr,
    HAS_SINKS: tl.constexpr,
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

        if HAS_SINKS:  # the head's sink: each row's first score, with no value
            m_i = tl.zeros([BLOCK_M], dtype=tl.float32) + tl.load(Sinks + head)
            l_i = tl.zeros([BLOCK_M], dtype=tl.float32) + 1.0
        else:
            m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
            l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        q_pos = prefix + offs_m  # absolute position of each query row
        kv_end = tl.minimum(seq, prefix + (mblk + 1) * BLOCK_M)  # causal: nothing past the block's last row
        # nothing before the block's first row's window (`window`: the layer's, or NO_WINDOW)
        kv_first = tl.maximum(prefix + mblk * BLOCK_M - window + 1, 0)
        for start_n in range((kv_first // BLOCK_N) * BLOCK_N, kv_end, BLOCK_N):
            offs_n = start_n + offs_n0
            mask_n = offs_n < kv_end
            slot, k = _load_keys(
                K, Table, req, offs_n, mask_n, kv_head, offs_d, mask_d, stride_tb, stride_kt, stride_kh, UPCAST
            )
            s = _dot(q, k.to(q.dtype), IEEE) * sm_scale
            keep = (q_pos[:, None] >= offs_n[None, :]) & (offs_n[None, :] > q_pos[:, None] - window) & mask_n[None, :]
            s = tl.where(keep, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            # Padded query rows see only -inf: keep them finite so no NaN is ever produced.
            m_new = tl.where(mask_m, m_new, 0.0)
            # A row whose window starts past this tile sees none of it: its sums stay 0 (exp(-inf)).
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
            acc, l_i = _accumulate(
                acc, l_i, m_i, m_use, s, V, slot, mask_n, kv_head, offs_d, mask_d, stride_vt, stride_vh, UPCAST, IEEE
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
    Sinks,
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
    HAS_SINKS: tl.constexpr,
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
    if HAS_SINKS:  # the head's sink joins the merge first: weight exp(sink), no value
        m = tl.load(Sinks + head).to(tl.float32)
        total = 1.0
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
