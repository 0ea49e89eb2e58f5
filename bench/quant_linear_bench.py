"""`python -m bench.quant_linear_bench [--threads N] [--rows 1,16,64,512]`: the q4 format's linear
kernels (runtime/cpu_kernels/quant_linear.cpp) against what they replaced, side by side in one run.

- `layers`: all 120 decoder linears of SmolLM2-135M's shapes (random 4-bit codes; the weights do
  not fit the caches, as in a real pass) through our int4 kernel and through
  `aten._weight_int4pack_mm_for_cpu`, alternated, best of several passes;
- `logits`: the model's own tied embedding (its GGUF Q8_0 codes) as the 49152 x 576 logits layer
  through our int8 kernel and as the bf16 copy q4 used before.

One JSON line per (part, rows): milliseconds of each and the ratio.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from runtime.linear import DenseLinear, Int4Linear, make_int8_group_linear, quant_kernels
from runtime.quant_codes import Int4Codes

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # fused qkv, o, fused gate/up, down
LAYERS = 30


def best_ms(fn, reps: int) -> float:
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.quant_linear_bench")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", default="1,16,64,512")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    if quant_kernels() is None:
        print(json.dumps({"bench": "quant_linear", "skipped": "the kernels are not built here (no AVX512-BF16)"}))
        return
    g = torch.Generator().manual_seed(0)
    ours, aten = [], []
    for _ in range(LAYERS):
        for n, k in SHAPES:
            codes = Int4Codes.quantize(torch.randn(n, k, generator=g) * 0.05)
            ours.append(Int4Linear(codes, None))
            aten.append(Int4Linear(codes, None, kernels=False))
    from runtime.loader import read_gguf_codes, resolve_model_dir, source_gguf

    embed = read_gguf_codes(source_gguf(resolve_model_dir()))["model.embed_tokens.weight"]
    int8, bf16 = make_int8_group_linear(embed), DenseLinear(embed.dequantize(), None, torch.bfloat16)
    for rows in [int(r) for r in args.rows.split(",")]:
        xs = {k: torch.randn(rows, k, generator=g).bfloat16() for k in (576, 1536)}
        reps = 7 if rows <= 64 else 3
        mine = theirs = float("inf")
        for _ in range(reps):  # alternated, so a slow spell of the machine hits both
            mine = min(mine, best_ms(lambda: [lin.native(xs[lin.shape[1]]) for lin in ours], 1))
            theirs = min(theirs, best_ms(lambda: [lin.native(xs[lin.shape[1]]) for lin in aten], 1))
        print(json.dumps({"bench": "quant_linear", "part": "layers", "rows": rows, "threads": args.threads,
                          "int4_ms": round(mine, 3), "aten_int4_ms": round(theirs, 3),
                          "speedup": round(theirs / mine, 3)}), flush=True)
        x = xs[576]
        a = b = float("inf")
        for _ in range(reps * 2):
            a = min(a, best_ms(lambda: int8.native(x), 1))
            b = min(b, best_ms(lambda: bf16.native(x), 1))
        print(json.dumps({"bench": "quant_linear", "part": "logits", "rows": rows, "threads": args.threads,
                          "int8_ms": round(a, 3), "bf16_ms": round(b, 3), "speedup": round(b / a, 3)}), flush=True)


if __name__ == "__main__":
    main()
