"""Decode passes replayed from CUDA graphs (CUDA only; anchor: SGLang `cuda_graph_runner.py`).

A decode step of a small model is a few hundred tiny kernel launches, so at small batch sizes the
GPU waits on Python. One graph per batch size in `BATCH_SIZES` records the whole decode forward
(embedding, layers, Triton decode attention, logits) over static input buffers; a step copies its
inputs into the buffers and replays the smallest graph that holds it.

- Padded rows (batch 5 runs in the graph of 8) read slot 0.. of their stale table rows and write
  their K/V into the pool's `scratch_slot`, which no request or cache node ever owns.
- The slot table buffer is as wide as the longest sequence the engine allows, so one graph serves
  every KV length; the kernels stop at each request's own length.
- Only pure decode batches (one new token and one logits row per request) are replayed; extend and
  jump-forward passes run eagerly.
- Each size has a second graph for steps with shared-prefix (cascade) groups: the prefix kernel's
  grid is fixed (one task per row at most, a fixed number of splits) and a step writes its tasks
  into static buffers; tasks it does not use have zero splits, so their programs return at once.
  Steps without groups replay the first graph, which has no prefix kernel at all.

`capture=False` keeps the static-buffer path but runs it eagerly: tests use it on CPU (Triton
interpreter) to check the padding logic without a GPU. Nothing here touches CUDA unless capturing.
"""

from __future__ import annotations

import logging
import time

import torch

from runtime.attention import AttentionBackend
from runtime.attention.base import refuse_sinks
from runtime.attention.triton_backend import (
    DecodeMetadata,
    PrefixTasks,
    decode_attention,
    decode_groups,
    decode_head_blocks,
    default_max_splits,
    num_kv_splits,
    own_starts,
    plan_prefix_tasks,
    prefix_config,
    prefix_max_splits,
)
from runtime.forward_batch import ForwardBatch
from runtime.kvcache.pool import KVPool

log = logging.getLogger("jumpgate.cuda_graphs")

BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)


class _StaticDecodeAttention(AttentionBackend):
    """Triton decode attention over static metadata buffers; `prepare` runs inside the graph."""

    name = "triton-graph"

    def __init__(
        self,
        q_rows: torch.Tensor,
        seq_lens: torch.Tensor,
        table: torch.Tensor,
        kv_start: torch.Tensor,
        prefix_splits: torch.Tensor,
        prefix: PrefixTasks | None,
        max_splits: int,
        min_split_tokens: int,
    ):
        self.q_rows, self.seq_lens, self.table = q_rows, seq_lens, table
        self.kv_start, self.prefix_splits, self.prefix = kv_start, prefix_splits, prefix
        self.max_splits, self.min_split_tokens = max_splits, min_split_tokens
        self.meta: DecodeMetadata | None = None

    def prepare(self, batch: ForwardBatch) -> None:
        # device ops only
        splits = num_kv_splits(self.seq_lens - self.kv_start, self.max_splits, self.min_split_tokens)
        self.meta = DecodeMetadata(
            self.q_rows,
            self.seq_lens,
            self.table,
            splits,
            self.max_splits,
            kv_start=self.kv_start,
            prefix_splits=self.prefix_splits,
            prefix=self.prefix,
        )

    def forward(self, q, k_cache, v_cache, window: int = 0, sinks: torch.Tensor | None = None) -> torch.Tensor:
        refuse_sinks(self, sinks)  # a MoE model (gpt-oss) is never captured: graph_capturable
        out = torch.empty_like(q)
        meta = self.meta
        if window > 0:  # a sliding-window layer: own positions from seq - window, no prefix tasks (device ops)
            kv_start = torch.clamp(self.seq_lens - window, min=0).to(torch.int32)
            splits = num_kv_splits(self.seq_lens - kv_start, self.max_splits, self.min_split_tokens)
            meta = DecodeMetadata(
                self.q_rows, self.seq_lens, self.table, splits, self.max_splits, kv_start, torch.zeros_like(kv_start)
            )
        decode_attention(q, k_cache, v_cache, out, meta)
        return out


def graph_batch_sizes(max_batch: int, sizes: tuple[int, ...] = BATCH_SIZES) -> list[int]:
    """The sizes up to the first one that holds `max_batch` (none above it)."""
    out = []
    for s in sorted(sizes):
        out.append(s)
        if s >= max_batch:
            break
    return out


class DecodeCudaGraphs:
    def __init__(
        self,
        model,
        kv: KVPool,
        max_batch: int,
        max_seq_len: int,
        *,
        min_split_tokens: int = 256,
        batch_sizes: tuple[int, ...] = BATCH_SIZES,
        capture: bool = True,
        max_kv_splits: int | None = None,
    ):
        device = kv.device
        if capture and device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, not {device.type}")
        self.model, self.kv, self.capture = model, kv, capture
        self.sizes = graph_batch_sizes(max_batch, batch_sizes)
        self.max_bs = self.sizes[-1]
        self.max_seq_len = max_seq_len
        n = self.max_bs
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=device)
        self.positions = torch.zeros(n, dtype=torch.int64, device=device)
        self.out_slots = torch.full((n,), kv.scratch_slot, dtype=torch.int64, device=device)
        self.seq_lens = torch.ones(n, dtype=torch.int32, device=device)
        self.q_rows = torch.arange(n, dtype=torch.int32, device=device)
        self.logits_index = torch.arange(n, dtype=torch.int64, device=device)
        self.table = torch.full((n, max_seq_len), kv.scratch_slot, dtype=torch.int32, device=device)
        cfg = model.cfg
        _, head_blocks, _ = decode_head_blocks(cfg.num_heads, cfg.num_kv_heads)
        # shared-prefix tasks (at most one per row) and where each row's own positions start
        self.min_split_tokens = min_split_tokens
        self.per_task = prefix_config(cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, kv.dtype, device.type == "cuda")[
            "MEMBERS"
        ]
        self.prefix_most = prefix_max_splits(max_kv_splits, cfg.num_kv_heads, device)
        # rows: each task's shared length and prefix splits, each row's own start and prefix splits
        # (one buffer: a step writes them in one copy)
        self.prefix_ints = torch.zeros(4, n, dtype=torch.int32, device=device)
        shared_lens, task_splits, self.kv_start, prefix_splits = self.prefix_ints
        self.task_members = torch.full((n, self.per_task), -1, dtype=torch.int32, device=device)
        zeros = torch.zeros(n, dtype=torch.int32, device=device)  # never written: no shared prefix
        self.attn: dict[tuple[int, bool], _StaticDecodeAttention] = {}  # (batch size, cascade)
        for bs in self.sizes:
            splits = max_kv_splits or default_max_splits(bs, head_blocks, device)
            rows = (self.q_rows[:bs], self.seq_lens[:bs], self.table[:bs])
            self.attn[bs, False] = _StaticDecodeAttention(*rows, zeros[:bs], zeros[:bs], None, splits, min_split_tokens)
            tasks = PrefixTasks(self.task_members[:bs], shared_lens[:bs], task_splits[:bs], self.prefix_most)
            self.attn[bs, True] = _StaticDecodeAttention(
                *rows, self.kv_start[:bs], prefix_splits[:bs], tasks, splits, min_split_tokens
            )
        self.graphs: dict[tuple[int, bool], torch.cuda.CUDAGraph] = {}
        self.outputs: dict[tuple[int, bool], torch.Tensor] = {}
        if capture:
            self._capture_all()

    def _static_batch(self, bs: int) -> ForwardBatch:
        return ForwardBatch(
            input_ids=self.input_ids[:bs],
            positions=self.positions[:bs],
            out_slots=self.out_slots[:bs],
            extend_lens=[1] * bs,
            seq_lens=[1] * bs,
            slot_rows=[],
            logits_index=self.logits_index[:bs],
        )

    def _capture_all(self) -> None:
        t0 = time.perf_counter()
        pool = None
        for key in sorted(self.attn, reverse=True):  # largest first: smaller graphs reuse its memory pool
            fb, attn = self._static_batch(key[0]), self.attn[key]
            for _ in range(2):  # compile the Triton kernels, set up cuBLAS, outside the capture
                self.model.forward(fb, self.kv, attn)
            torch.cuda.synchronize(self.kv.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[key] = self.model.forward(fb, self.kv, attn)
            pool = graph.pool() if pool is None else pool
            self.graphs[key] = graph
        torch.cuda.synchronize(self.kv.device)
        log.info("captured decode CUDA graphs for batch sizes %s in %.1fs", self.sizes, time.perf_counter() - t0)

    def can_run(self, batch: ForwardBatch) -> bool:
        b = batch.batch_size
        return (
            0 < b <= self.max_bs
            and batch.num_tokens == b
            and batch.logits_index.numel() == b
            and max(batch.seq_lens) <= self.max_seq_len
        )

    def _write_prefix_tasks(self, batch: ForwardBatch) -> bool:
        """The step's shared-prefix tasks into the static buffers (every row is a decode: batch
        index = decode index), every row and task of them, so nothing of an earlier step is left.
        False: the step has none (the graph without the prefix kernel runs)."""
        groups = decode_groups(batch.prefix_groups, {i: i for i in range(batch.batch_size)})
        if not groups:
            return False
        n = self.max_bs
        plan = plan_prefix_tasks(groups, n, self.per_task, self.prefix_most, self.min_split_tokens)
        unused = n - len(plan.members)  # tasks of the fixed grid with nothing to do: zero splits
        members = plan.members + [[-1] * self.per_task] * unused
        ints = [
            plan.shared_lens + [0] * unused,
            plan.task_splits + [0] * unused,
            own_starts(groups, n),
            plan.request_splits,
        ]
        self.task_members.copy_(torch.tensor(members, dtype=torch.int32), non_blocking=True)
        self.prefix_ints.copy_(torch.tensor(ints, dtype=torch.int32), non_blocking=True)
        return True

    def run(self, batch: ForwardBatch) -> torch.Tensor:
        """Logits [B, vocab] of a pure decode batch (`can_run`). The result is a view of the graph's
        output buffer: read it before the next `run`."""
        b = batch.batch_size
        bs = next(s for s in self.sizes if s >= b)
        self.input_ids[:b].copy_(batch.input_ids, non_blocking=True)
        self.positions[:b].copy_(batch.positions, non_blocking=True)
        self.out_slots[:b].copy_(batch.out_slots, non_blocking=True)
        self.seq_lens[:b].copy_(torch.tensor(batch.seq_lens, dtype=torch.int32), non_blocking=True)
        table = torch.nn.utils.rnn.pad_sequence([r.reshape(-1) for r in batch.slot_rows], batch_first=True)
        self.table[:b, : table.shape[1]].copy_(table.to(torch.int32), non_blocking=True)
        if bs > b:  # padded rows: stale rows of an earlier batch must not write into real slots
            self.out_slots[b:bs].fill_(self.kv.scratch_slot)
            self.seq_lens[b:bs].fill_(1)
        key = (bs, self._write_prefix_tasks(batch))
        if not self.capture:
            return self.model.forward(self._static_batch(bs), self.kv, self.attn[key])[:b]
        self.graphs[key].replay()
        return self.outputs[key][:b]
