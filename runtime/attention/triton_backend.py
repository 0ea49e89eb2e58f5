"""TritonAttentionBackend: the launchers of the Triton attention kernels (triton_kernels.py, whose
docstring says what each computes), their launch configurations, the decode and shared-prefix
(cascade) metadata, and the backend the model runner calls on CUDA (on CPU under TRITON_INTERPRET=1).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import triton

from runtime.attention.base import AttentionBackend
from runtime.attention.triton_kernels import (
    NO_WINDOW,
    decode_merge_kernel,
    decode_split_kernel,
    extend_kernel,
    prefix_split_kernel,
)
from runtime.forward_batch import ForwardBatch, PrefixGroup


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
    window: int = 0,
    sinks: torch.Tensor | None = None,
) -> None:
    """Write the extend rows of `out` ([T, H, D], like q). Caches: [num_slots, KVH, D]. `window`
    > 0: a sliding-window layer's; `sinks` [H] float32: attention sinks."""
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
        q if sinks is None else sinks,  # not read without sinks
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
        window if window > 0 else NO_WINDOW,
        HAS_SINKS=sinks is not None,
        **cfg,
    )


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    out: torch.Tensor,
    meta: DecodeMetadata,
    block_n: int | None = None,
    sinks: torch.Tensor | None = None,
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
        q if sinks is None else sinks,  # not read without sinks
        splits,
        *mid_strides,
        out.stride(0),
        out.stride(1),
        HAS_SINKS=sinks is not None,
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
    supports_sinks = True
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

    def forward(self, q, k_cache, v_cache, window: int = 0, sinks: torch.Tensor | None = None) -> torch.Tensor:
        sinks = None if sinks is None else sinks.to(device=q.device, dtype=torch.float32).contiguous()
        out = torch.empty_like(q)
        if self.extend is not None:
            bm, bn = self.extend_blocks
            extend_attention(q, k_cache, v_cache, out, self.extend, bm, bn, window, sinks)
        if self.decode is not None:
            if self.decode.num_splits is None:
                self._size_splits(q.shape[1], k_cache.shape[1], q.shape[2], q.dtype, q.device)
            meta = self.decode if window <= 0 else self._windowed_decode(window)
            decode_attention(q, k_cache, v_cache, out, meta, self.decode_block_n, sinks)
        return out

    def _windowed_decode(self, window: int) -> DecodeMetadata:
        """A sliding-window layer's decode metadata: each request's own positions start at
        seq - window, no shared-prefix tasks. Device ops on the pass's tensors only."""
        d = self.decode
        kv_start = torch.clamp(d.seq_lens - window, min=0).to(torch.int32)
        return DecodeMetadata(
            d.q_rows,
            d.seq_lens,
            d.slot_table,
            num_kv_splits(d.seq_lens - kv_start, d.max_splits, self.min_split_tokens),
            d.max_splits,
            kv_start,
            torch.zeros_like(kv_start),
        )
