"""`python -m bench.quant_linear_bench [--threads N] [--rows 1,16,64,512]`: the q4 format's linear
kernels (runtime/cpu_kernels/quant_linear.cpp) against what they replaced, side by side in one run.

- `layers`: all 120 decoder linears of SmolLM2-135M's shapes (random 4-bit codes; the weights do
  not fit the caches, as in a real pass) through our int4 kernel and through
  `aten._weight_int4pack_mm_for_cpu`, alternated, best of several passes;
- `logits`: the model's own tied embedding (its GGUF Q8_0 codes) as the 49152 x 576 logits layer
  through our int8 kernel and as the bf16 copy q4 used before;
- `layers_i8` (where quant_linear_i8.cpp is built: AVX2 + FMA): the same layers through the integer
  kernel (activations as two int8 digits) that q4 runs on a CPU without native bf16, against fp32
  `F.linear` over the same (dequantized) weights: what it replaces;
- `layers_f32`, `logits_f32` (AVX2 + FMA): the layers and the logits layer through the float32-
  activation kernels (the logits layer is q4's there) against fp32 `F.linear` on the same weights.

One JSON line per (part, rows): milliseconds of each and the ratio.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from runtime.linear import CodesLinearF32, DenseLinear, Int4Linear, Int4LinearI8, f32_quant_kernels, \
    i8_quant_kernels, make_int8_group_linear, quant_kernels
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
    from runtime.loader import read_gguf_codes, resolve_model_dir, source_gguf

    embed = read_gguf_codes(source_gguf(resolve_model_dir()))["model.embed_tokens.weight"]
    rows = [int(r) for r in args.rows.split(",")]
    g = torch.Generator().manual_seed(0)
    codes = [Int4Codes.quantize(torch.randn(n, k, generator=g) * 0.05) for _ in range(LAYERS) for n, k in SHAPES]
    if quant_kernels() is None:
        print(json.dumps({"bench": "quant_linear", "skipped": "the bf16 kernels are not built here (no AVX512-BF16)"}))
    else:
        compare(rows, args.threads, "layers", "int4_ms", [Int4Linear(c, None) for c in codes],
                "aten_int4_ms", [Int4Linear(c, None, kernels=False) for c in codes], torch.bfloat16)
        compare(rows, args.threads, "logits", "int8_ms", [make_int8_group_linear(embed)],
                "bf16_ms", [DenseLinear(embed.dequantize(), None, torch.bfloat16)], torch.bfloat16)
    ops = f32_quant_kernels()
    if ops is None or i8_quant_kernels() is None:
        print(json.dumps({"bench": "quant_linear", "skipped": "the AVX2 kernels are not built here (no AVX2 + FMA)"}))
        return
    dense = [DenseLinear(c.dequantize(), None, torch.float32) for c in codes]
    compare(rows, args.threads, "layers_i8", "int4_i8_ms", [Int4LinearI8(c, None, ops) for c in codes],
            "fp32_ms", dense, torch.float32)
    compare(rows, args.threads, "layers_f32", "int4_f32_ms", [CodesLinearF32(c, None, ops) for c in codes],
            "fp32_ms", dense, torch.float32)
    compare(rows, args.threads, "logits_f32", "int8_f32_ms", [CodesLinearF32(embed, None, ops)],
            "fp32_ms", [DenseLinear(embed.dequantize(), None, torch.float32)], torch.float32)


def compare(rows: list[int], threads: int, part: str, ours_name: str, ours: list, theirs_name: str, theirs: list,
            dtype: torch.dtype) -> None:
    """Every layer of `ours`, then of `theirs`, alternated, best of several passes, per row count."""
    g = torch.Generator().manual_seed(1)
    for m in rows:
        xs = {k: torch.randn(m, k, generator=g).to(dtype) for k in {lin.shape[1] for lin in ours}}
        reps = 7 if m <= 64 else 3
        if len(ours) == 1:
            reps *= 2  # one layer: more passes for the same confidence
        mine = other = float("inf")
        for _ in range(reps):  # alternated, so a slow spell of the machine hits both
            mine = min(mine, best_ms(lambda: [lin.native(xs[lin.shape[1]]) for lin in ours], 1))
            other = min(other, best_ms(lambda: [lin.native(xs[lin.shape[1]]) for lin in theirs], 1))
        print(json.dumps({"bench": "quant_linear", "part": part, "rows": m, "threads": threads,
                          ours_name: round(mine, 3), theirs_name: round(other, 3),
                          "speedup": round(other / mine, 3)}), flush=True)


if __name__ == "__main__":
    main()
