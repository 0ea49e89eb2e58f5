"""`python -m bench.probes.layer_loop_bench [--batches 1,16,64] [--context 60] [--rounds 6]`: a decode pass
of the real model (`bench.suites.engine.decode_pass`) with its decoder layers in one C++ call
(runtime/cpu_kernels/decoder_layers.cpp) against the Python layer loop it replaces, in the default
weight format.

Both run in one engine on its own thread (one OpenMP team), alternated: each round times 40 passes
of each (the median), the result is the median over rounds. The pass is built directly, as
`python -m bench engine`'s split passes are (`context` slots per request, the pool's K/V as it
comes). One JSON line per batch size: `one_call_ms`, `python_loop_ms`, the milliseconds saved and
`speedup`.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import torch

from bench.harness.common import emit
from bench.suites.engine import decode_pass
from runtime.engine.engine import Engine


def compare(engine, batch_size: int, context: int, rounds: int) -> dict:
    model, cfg, attn = engine.runner.model, engine.model_config, engine.runner.attn
    batch, kv = decode_pass(model, cfg, attn, batch_size, context)
    ms: dict[str, list[float]] = {"one_call": [], "python_loop": []}
    for _ in range(rounds):
        for name in ms:
            with contextlib.nullcontext() if name == "one_call" else model.python_layer_loop():
                for _ in range(5):  # warm-up
                    model.forward(batch, kv, attn)
                times = []
                for _ in range(40):
                    t0 = time.perf_counter()
                    model.forward(batch, kv, attn)
                    times.append(time.perf_counter() - t0)
            ms[name].append(statistics.median(times) * 1e3)
    one, py = statistics.median(ms["one_call"]), statistics.median(ms["python_loop"])
    return {
        "bench": "layer_loop",
        "weights": model.weights,
        "batch": batch_size,
        "context": context,
        "threads": torch.get_num_threads(),
        "one_call_ms": one,
        "python_loop_ms": py,
        "saved_ms": py - one,
        "speedup": py / one,
        "one_call_rounds_ms": [round(x, 3) for x in ms["one_call"]],
        "python_loop_rounds_ms": [round(x, 3) for x in ms["python_loop"]],
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.probes.layer_loop_bench")
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--context", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--weights", default="auto")
    args = ap.parse_args(argv)
    engine = Engine(
        device="cpu", kv_pool_tokens=4096, radix_cache=False, weights=args.weights, max_running_requests=64
    ).start()
    try:
        if engine.runner.model.layer_loop is None:
            emit(
                {
                    "bench": "layer_loop",
                    "weights": engine.runner.model.weights,
                    "skipped": "this format's layers run the Python loop only",
                }
            )
            return
        for b in (int(x) for x in args.batches.split(",")):
            emit(engine.call(lambda: compare(engine, b, args.context, args.rounds)).result())
    finally:
        engine.shutdown()


if __name__ == "__main__":
    main()
