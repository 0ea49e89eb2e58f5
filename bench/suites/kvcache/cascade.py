"""`python -m bench cascade`: one batched decode step of the real model over a long shared prefix,
with shared-prefix (cascade) attention on and off, against the same batch over short contexts.

The batch is built directly (the KV pool holds random K/V: attention's cost does not depend on the
values), so the figure is the forward pass alone: `batch` requests each decoding one token over
`shared` prefix slots they all hold (one contiguous run, as a cached system prompt is) plus
`private` slots of their own. One JSON line per (shared length, mode); `ratio_vs_short` is the
step time over that of the same batch over `private`-token contexts (the issue's target: <= 1.5).
"""

from __future__ import annotations

import argparse
import time

import torch

from bench.harness.common import emit
from runtime.attention.cascade import find_prefix_groups
from runtime.engine_config import EngineConfig
from runtime.forward_batch import ForwardBatch, PrefixGroup
from runtime.model.loader import read_config, resolve_model_dir
from runtime.model.runner import ModelRunner, pick_device, pick_dtype


def decode_batch(
    batch: int, shared: int, private: int, device: torch.device, distinct: int | None = None
) -> ForwardBatch:
    """Slots [0, shared) are the shared prefix; request i's private slots follow in one block, its
    last slot being the token this step decodes. `distinct`: the prefix's slots repeat the first
    `distinct` (the same work over K/V that stays in the caches: a timing without memory, not a
    meaningful attention)."""
    prefix = torch.arange(shared) if distinct is None else torch.arange(shared) % distinct
    rows = [torch.cat([prefix, torch.arange(shared + i * private, shared + (i + 1) * private)]) for i in range(batch)]
    seq_lens = [r.numel() for r in rows]
    return ForwardBatch(
        input_ids=torch.full((batch,), 42, dtype=torch.int64, device=device),
        positions=torch.tensor([s - 1 for s in seq_lens], dtype=torch.int64, device=device),
        out_slots=torch.stack([r[-1] for r in rows]).to(device),
        extend_lens=[1] * batch,
        seq_lens=seq_lens,
        slot_rows=rows,
        logits_index=torch.arange(batch, device=device),
    )


def step_seconds(runner: ModelRunner, batch: ForwardBatch, reps: int, attention_q: torch.Tensor | None) -> float:
    """Best of `reps` forward passes (the least disturbed by other processes on the machine); with
    `attention_q`, of the attention backend's `forward` on layer 0 alone."""
    sync = torch.cuda.synchronize if runner.device.type == "cuda" else (lambda: None)
    if attention_q is None:
        step = lambda: runner.model.forward(batch, runner.kv, runner.attn)  # noqa: E731
    else:
        runner.attn.prepare(batch)
        step = lambda: runner.attn.forward(attention_q, runner.kv.k[0], runner.kv.v[0])  # noqa: E731
    step()  # warm-up
    best = float("inf")
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        step()
        sync()
        best = min(best, time.perf_counter() - t0)
    return best


def run(quick: bool = False, argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench cascade")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--shared", type=int, nargs="+", default=[3072] if quick else [64, 256, 1024, 3072])
    ap.add_argument("--private", type=int, default=100)
    ap.add_argument("--reps", type=int, default=2 if quick else 3)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    ap.add_argument("--attention", default="auto", help="attention backend (default: the engine's, auto)")
    ap.add_argument(
        "--attention-tiles",
        default="auto",
        choices=("auto", "on", "off"),
        help="the cpu kernel on AMX tiles (the engine's --attention-tiles; default auto)",
    )
    ap.add_argument(
        "--attention-only",
        action="store_true",
        help="time the attention backend alone (one layer) instead of the whole model",
    )
    ap.add_argument(
        "--shared-distinct",
        type=int,
        default=None,
        help="the shared prefix repeats this many slots (its K/V stays in the caches: the "
        "kernel's time without memory; timing only)",
    )
    args = ap.parse_args(argv or [])
    if args.shared_distinct is not None and args.shared_distinct < 1:
        ap.error("--shared-distinct: at least 1 slot")
    if args.threads:
        torch.set_num_threads(args.threads)
    device = pick_device(args.device)
    model_dir = resolve_model_dir(None)
    mc = read_config(model_dir)
    pool = max(args.shared) + args.batch * args.private + 16
    cfg = EngineConfig(
        device=device.type,
        kv_pool_tokens=pool,
        max_running_requests=args.batch,
        attention_backend=args.attention,
        attention_tiles=args.attention_tiles,
    )
    runner = ModelRunner(cfg, model_dir, mc, device, pick_dtype("auto", device), pool)
    for layer in (*runner.kv.k, *runner.kv.v):
        layer.normal_()
    q = (
        torch.randn(args.batch, mc.num_heads, mc.head_dim, device=device).to(runner.dtype)
        if args.attention_only
        else None
    )
    scope = "attention_layer0" if args.attention_only else "model"
    short = step_seconds(runner, decode_batch(args.batch, 0, args.private, device), args.reps, q)
    emit(
        {
            "bench": "cascade",
            "scope": scope,
            "batch": args.batch,
            "shared": 0,
            "private": args.private,
            "mode": "short",
            "step_ms": short * 1e3,
            "device": device.type,
            "threads": torch.get_num_threads(),
            "attention": runner.attn.name,
            "weights": runner.model.weights,
        }
    )
    for shared in args.shared:
        batch = decode_batch(args.batch, shared, args.private, device, args.shared_distinct)
        # on: the runner's rule (it may decline to group); forced: one group of all, whatever it saves
        modes = {
            "cascade_off": [],
            "cascade_on": find_prefix_groups(
                batch.extend_lens, batch.seq_lens, batch.slot_rows, runner.attn.max_short_extend
            ),
            "cascade_forced": [PrefixGroup(shared, list(range(args.batch)))] if shared else [],
        }
        for mode, groups in modes.items():
            batch.prefix_groups = groups
            t = step_seconds(runner, batch, args.reps, q)
            distinct = {"shared_distinct": args.shared_distinct} if args.shared_distinct else {}
            emit(
                {
                    "bench": "cascade",
                    "scope": scope,
                    "batch": args.batch,
                    "shared": shared,
                    "private": args.private,
                    **distinct,
                    "mode": mode,
                    "grouped": bool(batch.prefix_groups),
                    "step_ms": t * 1e3,
                    "ratio_vs_short": t / short,
                    "device": device.type,
                    "threads": torch.get_num_threads(),
                }
            )
