"""`python -m bench.probes.attention_precision [--lengths 1024,3072,8192] [--rounds 5] [--threads 1]`:
the cpu attention kernel alone (runtime/cpu_kernels/paged_attention.cpp), one layer of the default
model's shape (9 query heads, 3 KV heads, head_dim 64), at each --attention-precision on AMX tiles
and on the float32 vector code (`--attention-tiles off`); on a CPU with AVX512-BF16 and no AMX, the
bf16 precision's dot-product scores against the vector code (float32 precision is the vector code
there).

A prefill: one request's prompt in the engine's chunks of 512 rows, each chunk attending to all
the keys before it; a decode: 16 requests of `--decode-context` keys, one row each. The modes are
alternated within each round and timed in CPU seconds of this process (`time.process_time`), so a
shared host's other work costs less of the figure than wall time would; the result is the median
over rounds. One JSON line per case: milliseconds per layer per mode, and bf16's speed-up over
float32 and over the vector code.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from bench.harness.common import emit
from runtime.cpu_kernels import load_cpu_kernels

MODES = {"vector": (False, False), "float32": (True, False), "bf16": (True, True)}  # (tiles, bf16 products)
HEADS, KV_HEADS, DIM, CHUNK = 9, 3, 64, 512


def head_major(x: torch.Tensor) -> torch.Tensor:
    return x.transpose(0, 1).contiguous().transpose(0, 1)  # KVPool's CPU layout


def prefill_case(ops, n: int):
    g = torch.Generator().manual_seed(n)
    k = head_major(torch.randn(n, KV_HEADS, DIM, generator=g))
    v = head_major(torch.randn(n, KV_HEADS, DIM, generator=g).bfloat16().float())  # the qkv layer's bf16
    q = torch.randn(n, HEADS, DIM, generator=g)
    slots = torch.arange(n)
    chunks = [(s, min(n, s + CHUNK)) for s in range(0, n, CHUNK)]
    metas = [torch.tensor([[0, e - s, e, 0, -1, 0]]) for s, e in chunks]

    def run(tiles: bool, bf16: bool) -> None:
        for (s, e), meta in zip(chunks, metas):
            ops.paged_attention(q[s:e], k, v, slots[:e], meta, tiles, True, bf16)

    return run


def decode_case(ops, batch: int, context: int):
    g = torch.Generator().manual_seed(context)
    n = batch * context
    k = head_major(torch.randn(n, KV_HEADS, DIM, generator=g))
    v = head_major(torch.randn(n, KV_HEADS, DIM, generator=g).bfloat16().float())
    q = torch.randn(batch, HEADS, DIM, generator=g)
    slots = torch.arange(n)
    meta = torch.tensor([[b, 1, context, b * context, -1, 0] for b in range(batch)])

    def run(tiles: bool, bf16: bool) -> None:
        for _ in range(20):
            ops.paged_attention(q, k, v, slots, meta, tiles, True, bf16)

    return run, 20


def measure(run, rounds: int, modes: dict[str, tuple[bool, bool]], per: int = 1) -> dict[str, float]:
    for tiles, bf16 in modes.values():
        run(tiles, bf16)  # warm-up
    times: dict[str, list[float]] = {m: [] for m in modes}
    for _ in range(rounds):
        for mode, (tiles, bf16) in modes.items():
            t0 = time.process_time()
            run(tiles, bf16)
            times[mode].append((time.process_time() - t0) / per * 1e3)
    ms = {f"{m}_ms": statistics.median(t) for m, t in times.items()}
    if "float32" in modes:
        ms["bf16_vs_float32"] = ms["float32_ms"] / ms["bf16_ms"]
    ms["bf16_vs_vector"] = ms["vector_ms"] / ms["bf16_ms"]
    return ms


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.probes.attention_precision")
    ap.add_argument("--lengths", default="1024,3072,8192", help="prefill prompt lengths in tokens")
    ap.add_argument("--decode-context", default="1024", help="decode contexts (16 requests each), comma-separated")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (CPU time adds theirs up)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    ops = load_cpu_kernels()
    if ops is None or not (ops.int4_linear_amx() or ops.paged_attention_bf16_dot()):
        raise SystemExit("attention_precision: needs the cpu kernels on a CPU with AMX or AVX512-BF16")
    path = "amx" if ops.int4_linear_amx() else "bf16-dot"
    modes = MODES if path == "amx" else {m: MODES[m] for m in ("vector", "bf16")}
    for n in (int(x) for x in args.lengths.split(",")):
        line = {"probe": "attention_precision", "case": "prefill", "tokens": n, "chunk": CHUNK, "path": path}
        emit({**line, "threads": args.threads, **measure(prefill_case(ops, n), args.rounds, modes)})
    for c in (int(x) for x in args.decode_context.split(",")):
        run, per = decode_case(ops, 16, c)
        line = {"probe": "attention_precision", "case": "decode", "batch": 16, "context": c, "path": path}
        emit({**line, "threads": args.threads, **measure(run, args.rounds, modes, per)})


if __name__ == "__main__":
    main()
