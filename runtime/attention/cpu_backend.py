"""The CPU attention backend: a batch-invariant C++ kernel over the KV pool, read in place.

Each query row's output is a function of its own q, its request's slots and its visible length n
(prefix + index of the token + 1) only: keys are folded in blocks of 32 aligned to absolute
position 0, each block reduced in one fixed order (a W-lane dot product over head_dim, W = 16
with AVX-512, 8 with AVX2: runtime/cpu_kernels/vec.h; block max, exp, sums in key order), blocks
combined by the online-softmax rescale. So a row is bitwise the same alone or in any batch, as a decode or inside a longer extend, with any thread count.
That is what lets bf16-activation weight formats (q4) keep Jumpgate's equalities: SDPA over
gathered, padded or cascade-merged K/V differs in its last bits between those cases, and the next
layer's bf16 rounding turns that into flipped tokens at near-ties.

The kernel (runtime/cpu_kernels/paged_attention.cpp) is built on first use (runtime/cpu_kernels/). Per pass,
`prepare` makes two small tensors: all requests' slot rows concatenated, and one
(first q row, new tokens, seq len, slot offset, prefix group, shared length) line per request.
Rows of one request are tiled 16 at a time so each K/V block is loaded once per tile; the work
items are (tile, KV head), with the query heads of one KV head together (GQA), handed to threads
one by one.

Prefix groups (ForwardBatch.prefix_groups, requests holding the same cached prefix slots): up to
16 rows of a group's members form one tile, whose blocks inside the shared prefix are loaded once
for all of them (16, not 32: a 32-request group was then one work item per KV head, 3 items for
2 threads, and the shared part of a cascade step took 4.4 ms a layer instead of 3.4; the prefix is
in cache for the second tile). Within a block the kernel runs its rows' scores, softmaxes and
value sums as three passes, so one row's short dependent chains overlap the next row's work. Every row still folds the same absolute blocks in the same order, so grouping
changes no bit of the output (unlike the torch backend's cascade, which merges two softmaxes).
float32 only: other dtypes (e.g. --dtype bfloat16 on CPU) go through the torch backend.

AMX tiles (`enable_tiles`, the engine's --attention-tiles, on by default where it can run: q4, q8
and bf16 weights on a CPU with AMX): every row's block products run as bf16 tile products instead
(runtime/cpu_kernels/paged_attention_tiles.h), at one of two precisions (--attention-precision):
`float32`, q and k split into two bf16 words each (three products a score; within 1e-4 of SDPA),
or `bf16`, q and k rounded once to bf16 (one product a score, float32 sums;
runtime/cpu_kernels/paged_attention_bf16.h); the probabilities are two words at both. Same blocks, same fold order, so the invariance
above holds on that path too; only formats that round the attention output to bf16 next may take
it (TILE_FORMATS), and once on, every pass takes it. Long prompts prefill faster and a prefix group's
shared blocks cost less; a decode's few rows per block pay the K/V preparation alone, so decoding
long unshared contexts costs more (figures in docs/perf-log.md).

Without AMX, on a CPU with AVX512-BF16 (AMD Zen 4 and later), `bf16` precision runs the vector
path with each block's scores from bf16 dot-product instructions (runtime/cpu_kernels/
paged_attention_dot.h: q and k rounded once to bf16, float32 sums; the softmax and the value sums
as at float32 precision), for the rows that see more than 512 keys, as the tiles above; the
banner says `cpu-bf16-dot`. `float32` precision there is the float32 vector path itself.

Sliding windows (`window` > 0, a layer's; base.py): a row of visible length n folds only the
blocks that hold keys n - window .. n - 1, the keys before n - window in its first block scored
-inf, the blocks still aligned to position 0 and folded in the same order, so the invariance holds
under a window too (a prefix group's rows each skip their own blocks). Windowed calls take the
vector path: the AMX path has no window.

Attention sinks (gpt-oss, `sinks`): each row's fold starts from its head's sink as the running max
with sum 1 (exp(sink - sink)), no value: one fixed starting point, whatever the batch, tile or
thread split, so the invariance holds. Calls with sinks take the vector path too.

The pool is read in place, head-major (`kv_head_major`: each KV head's slots in one run of
memory, runtime/kvcache/pool.py), and `forward_as` writes the output straight in bf16 when the next
layer takes bf16.
"""

from __future__ import annotations

from typing import Any

import torch

from runtime.attention.base import AttentionBackend
from runtime.attention.torch_backend import TorchAttentionBackend
from runtime.forward_batch import ForwardBatch

# Formats whose linear layers take bf16 activations: the attention output is rounded to bf16 next,
# so near-float32 tile products cost them nothing that matters (tests/runtime/model/test_weight_formats.py's drift).
TILE_FORMATS = frozenset({"q4", "q8", "bf16"})
PRECISIONS = ("bf16", "float32")  # of the tile products (--attention-precision, after auto)
# what --attention-precision auto takes: bf16 agrees with the float32 reference's greedy tokens as
# often as float32 tiles do (tests/runtime/model/test_weight_formats.py's long-context drift)
AUTO_PRECISION = "bf16"


def tile_precision(requested: str) -> str:
    """--attention-precision's value after `auto`."""
    return AUTO_PRECISION if requested == "auto" else requested


class CpuPagedAttentionBackend(AttentionBackend):
    name = "cpu"
    supports_prefix_groups = True
    max_short_extend = TorchAttentionBackend.max_short_extend  # longest extend that joins a group
    batch_invariant = True  # for float32 passes; other dtypes go through torch
    kv_head_major = True  # a KV head's slots in one run: each block's K/V reads stream
    supports_sinks = True

    def __init__(self, ext: Any):  # torch.ops.jumpgate_cpu (runtime/cpu_kernels/)
        self.ext = ext
        self.tiles = False  # AMX tile products or bf16 dot scores: set by enable_tiles (module docstring)
        self.bf16_products = False  # their precision: q and k as bf16 (else each split in two words)
        self.batch: ForwardBatch | None = None
        self.fallback: TorchAttentionBackend | None = None  # prepared lazily, for non-fp32 passes

    def enable_tiles(self, weights: str, precision: str = "float32") -> bool:
        if precision not in PRECISIONS:
            raise ValueError(f"attention precision {precision!r}: expected one of {', '.join(PRECISIONS)}")
        amx = bool(self.ext.int4_linear_amx())  # the CPU grants AMX
        # without AMX only bf16 precision differs from the vector path: its dot-product scores
        dot = not amx and precision == "bf16" and bool(self.ext.paged_attention_bf16_dot())
        self.tiles = weights in TILE_FORMATS and (amx or dot)
        self.bf16_products = self.tiles and precision == "bf16"
        if self.tiles:
            self.name = "cpu-bf16-dot" if dot else "cpu-amx-bf16" if self.bf16_products else "cpu-amx"
        return self.tiles

    def prepare(self, batch: ForwardBatch) -> None:
        self.batch, self.fallback = batch, None
        rows = batch.slot_rows
        self.slots = (rows[0] if len(rows) == 1 else torch.cat(rows)).to(torch.int64).contiguous()
        # built in Python and made a tensor once: a handful of torch ops here cost more than the
        # decode step's norms (profiled at batch 1)
        n = len(batch.extend_lens)
        group, shared = [-1] * n, [0] * n
        for gi, g in enumerate(batch.prefix_groups):
            for i in g.members:
                group[i], shared[i] = gi, g.shared_len
        meta, first_row, first_slot = [], 0, 0
        for i, (ext, seq) in enumerate(zip(batch.extend_lens, batch.seq_lens)):
            meta.append((first_row, ext, seq, first_slot, group[i], shared[i]))
            first_row += ext
            first_slot += seq
        self.meta = torch.tensor(meta, dtype=torch.int64).reshape(n, 6)

    def forward(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        window: int = 0,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if q.dtype != torch.float32 or k_cache.dtype != torch.float32:
            if self.fallback is None:
                self.fallback = TorchAttentionBackend()
                self.fallback.prepare(self.batch)
            return self.fallback.forward(q, k_cache, v_cache, window, sinks)
        return self.ext.paged_attention(
            q, k_cache, v_cache, self.slots, self.meta, self.tiles, False, self.bf16_products, window, _f32(sinks)
        )

    def paged_tables(self) -> tuple[torch.Tensor, torch.Tensor, bool, bool]:
        # float32 q and caches only: the loop's pool is float32
        return self.slots, self.meta, self.tiles, self.bf16_products

    def forward_as(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        dtype: torch.dtype,
        window: int = 0,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if dtype == torch.bfloat16 and q.dtype == torch.float32 and k_cache.dtype == torch.float32:
            # written as bf16 by the kernel: the same values as float32 then .to(bfloat16)
            return self.ext.paged_attention(
                q, k_cache, v_cache, self.slots, self.meta, self.tiles, True, self.bf16_products, window, _f32(sinks)
            )
        return super().forward_as(q, k_cache, v_cache, dtype, window, sinks)


def _f32(sinks: torch.Tensor | None) -> torch.Tensor | None:
    return None if sinks is None else sinks.to(torch.float32).contiguous()
