"""`python -m bench.probes.moe_bench [--formats fp32,q8,q4] [--rows 1,16,128,512] [--hidden 1024]
[--experts 64] [--top-k 8] [--width 256] [--rounds 5] [--threads N]`: one MoE layer (runtime/model/moe.py, random
weights in a Qwen3-MoE-like shape) with a pass's experts grouped, as the decoder runs it (the rows
sorted by expert, one matmul per active expert), against each token running its own top-k experts
one row at a time (what grouping replaces).

Both route the same way and give the same output (checked within 1e-3 before timing); the rows come
in the experts' activation dtype, as the decoder's fused path gives them (bf16 for q8/q4). With one
row the same experts serve every call, so their weights stay in the caches; from 16 rows on most
experts are active and each call streams them.
Each round times both (median of 10 calls); the result is the median over rounds. One JSON line per
format and row count: `grouped_ms`, `per_token_ms`, `speedup`, `active_experts` (matmuls per pass
grouped) and `per_token_matmuls`.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from bench.harness.common import emit
from runtime.model.decoder import make_linear
from runtime.model.moe import MoEMLP


def build(fmt: str, hidden: int, experts: int, top_k: int, width: int) -> MoEMLP:
    g = torch.Generator().manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, generator=g) * 0.02

    pairs = [
        (
            make_linear(fmt, [rand(width, hidden), rand(width, hidden)], None, torch.float32),
            make_linear(fmt, [rand(hidden, width)], None, torch.float32),
        )
        for _ in range(experts)
    ]
    return MoEMLP(rand(experts, hidden) * 50, pairs, top_k, True)


def per_token(moe: MoEMLP, x: torch.Tensor) -> torch.Tensor:
    """Each token's own top-k experts, one row each: T x k matmul pairs."""
    weights, ids = moe.route(x)
    out = torch.zeros(x.shape, dtype=torch.float32)  # float32 sums, as MoEMLP's
    for t in range(x.shape[0]):
        row = x[t : t + 1]
        for w, e in zip(weights[t].tolist(), ids[t].tolist()):
            gate_up, down = moe.experts[e]
            gate, up = gate_up(row).chunk(2, dim=-1)
            out[t] += w * down(F.silu(gate) * up).float()[0]
    return out


def median_ms(fn, x, calls: int = 10) -> float:
    fn(x)  # warm-up
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn(x)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.probes.moe_bench")
    ap.add_argument("--formats", default="fp32,q8,q4")
    ap.add_argument("--rows", default="1,16,128,512")
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--width", type=int, default=256, help="one expert's MLP width (moe_intermediate_size)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    for fmt in args.formats.split(","):
        moe = build(fmt, args.hidden, args.experts, args.top_k, args.width)
        for rows in map(int, args.rows.split(",")):
            x = torch.randn(rows, args.hidden, generator=torch.Generator().manual_seed(rows))
            x = x.to(moe.experts[0][0].act_dtype)  # as the decoder's fused path feeds them (bf16 for q4/q8)
            torch.testing.assert_close(moe(x), per_token(moe, x), atol=1e-3, rtol=1e-3)
            grouped, single = [], []
            for _ in range(args.rounds):
                grouped.append(median_ms(moe, x))
                single.append(median_ms(lambda v: per_token(moe, v), x, calls=3 if rows > 64 else 10))
            g, s = statistics.median(grouped), statistics.median(single)
            emit(
                {
                    "bench": "moe_layer",
                    "weights": fmt,
                    "rows": rows,
                    "hidden": args.hidden,
                    "experts": args.experts,
                    "top_k": args.top_k,
                    "width": args.width,
                    "threads": torch.get_num_threads(),
                    "active_experts": int(moe.route(x)[1].unique().numel()),
                    "per_token_matmuls": 2 * rows * args.top_k,
                    "grouped_ms": g,
                    "per_token_ms": s,
                    "speedup": s / g,
                }
            )


if __name__ == "__main__":
    main()
