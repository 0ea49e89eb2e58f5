"""`python -m bench.probes.quant_linear_bench [--threads N] [--rows 1,16,64,512]`: the q4 format's linear
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

`--q6k` instead runs SmolLM2's 30 ffn_down shapes (576 x 1536) as Q6_K blocks through the int4
kernel reading their 6-bit codes as stored (`packed6_ms`) against the same codes widened to int8
(`int8_ms`, how Q6_K ran before).

`--tile-ceiling` instead builds and runs tile_ceiling.cpp (g++, one thread): the 512-bit dot-product
peaks (`vdpbf16ps`, `vpdpbusd`), the kernel's 8-row bf16 tile against that peak, and the same tile
with int8 activations in `vpdpbusd` (what the q4 linears' arithmetic could gain; not a kernel here).

`--stream` instead measures what limits a one-row decode: the bytes a second our int4 kernel
streams over working sets too large for the caches, as a few large calls or many small ones, with
one thread and with two, against fp32 `F.linear` (MKL's GEMV) over the same bytes in the same
call counts, and (`int4_cached`) the int4 kernel over one of the layers as many times, whose
bytes stay in the caches. One JSON line per (kernel, calls, threads): the weight bytes, and `gb_s`
those read a second.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from runtime.model.linear import (
    CodesLinearF32,
    DenseLinear,
    Int4Linear,
    Int4LinearI8,
    f32_quant_kernels,
    i8_quant_kernels,
    make_int8_group_linear,
    make_q4_linear,
    make_wide_linear,
    quant_kernels,
)
from runtime.model.quant_codes import Int4Codes

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
    ap = argparse.ArgumentParser(prog="python -m bench.probes.quant_linear_bench")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", default="1,16,64,512")
    ap.add_argument("--stream", action="store_true", help="bytes a second at one row over large working sets")
    ap.add_argument("--q6k", action="store_true", help="Q6_K layers: 6-bit codes as stored against int8 codes")
    ap.add_argument(
        "--tile-ceiling", action="store_true", help="the bf16 tile and an int8-activation tile vs the peaks"
    )
    args = ap.parse_args(argv)
    if args.stream:
        return stream()
    if args.tile_ceiling:
        return tile_ceiling()
    torch.set_num_threads(args.threads)
    if args.q6k:
        return q6k([int(r) for r in args.rows.split(",")], args.threads)
    from runtime.model.loader import read_gguf_codes, resolve_model_dir, source_gguf

    embed = read_gguf_codes(source_gguf(resolve_model_dir()))["model.embed_tokens.weight"]
    rows = [int(r) for r in args.rows.split(",")]
    g = torch.Generator().manual_seed(0)
    codes = [Int4Codes.quantize(torch.randn(n, k, generator=g) * 0.05) for _ in range(LAYERS) for n, k in SHAPES]
    if quant_kernels() is None:
        print(json.dumps({"bench": "quant_linear", "skipped": "the bf16 kernels are not built here (no AVX512-BF16)"}))
    else:
        compare(
            rows,
            args.threads,
            "layers",
            "int4_ms",
            [Int4Linear(c, None) for c in codes],
            "aten_int4_ms",
            [Int4Linear(c, None, kernels=False) for c in codes],
            torch.bfloat16,
        )
        compare(
            rows,
            args.threads,
            "logits",
            "int8_ms",
            [make_int8_group_linear(embed)],
            "bf16_ms",
            [DenseLinear(embed.dequantize(), None, torch.bfloat16)],
            torch.bfloat16,
        )
    ops = f32_quant_kernels()
    if ops is None or i8_quant_kernels() is None:
        print(json.dumps({"bench": "quant_linear", "skipped": "the AVX2 kernels are not built here (no AVX2 + FMA)"}))
        return
    dense = [DenseLinear(c.dequantize(), None, torch.float32) for c in codes]
    compare(
        rows,
        args.threads,
        "layers_i8",
        "int4_i8_ms",
        [Int4LinearI8(c, None, ops) for c in codes],
        "fp32_ms",
        dense,
        torch.float32,
    )
    compare(
        rows,
        args.threads,
        "layers_f32",
        "int4_f32_ms",
        [CodesLinearF32(c, None, ops) for c in codes],
        "fp32_ms",
        dense,
        torch.float32,
    )
    compare(
        rows,
        args.threads,
        "logits_f32",
        "int8_f32_ms",
        [CodesLinearF32(embed, None, ops)],
        "fp32_ms",
        [DenseLinear(embed.dequantize(), None, torch.float32)],
        torch.float32,
    )


def compare(
    rows: list[int],
    threads: int,
    part: str,
    ours_name: str,
    ours: list,
    theirs_name: str,
    theirs: list,
    dtype: torch.dtype,
) -> None:
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
        print(
            json.dumps(
                {
                    "bench": "quant_linear",
                    "part": part,
                    "rows": m,
                    "threads": threads,
                    ours_name: round(mine, 3),
                    theirs_name: round(other, 3),
                    "speedup": round(other / mine, 3),
                }
            ),
            flush=True,
        )


def q6k(rows: list[int], threads: int) -> None:
    import numpy as np
    from gguf import GGMLQuantizationType as T

    from runtime.model.gguf_blocks import layer_codes, quantize

    if quant_kernels() is None:
        print(json.dumps({"bench": "quant_linear", "part": "q6k", "skipped": "no AVX512-BF16 kernels here"}))
        return
    rng = np.random.default_rng(0)
    codes = [
        layer_codes(T.Q6_K, quantize(rng.standard_normal((576, 1536)).astype(np.float32) * 0.05, T.Q6_K))
        for _ in range(LAYERS)
    ]
    packed6 = [make_q4_linear(c, None) for c in codes]
    int8 = [make_wide_linear(c, None) for c in codes]
    print(
        json.dumps(
            {
                "bench": "quant_linear",
                "part": "q6k",
                "packed6_bytes": sum(x.nbytes for x in packed6),
                "int8_bytes": sum(x.nbytes for x in int8),
            }
        ),
        flush=True,
    )
    compare(rows, threads, "q6k", "packed6_ms", packed6, "int8_ms", int8, torch.bfloat16)


# (calls, output columns) of K = 576 inputs: ~85 MB of int4 codes and float32 scales and offsets
# either way, past what the caches keep, as 64 calls the size of the fused gate/up layer or 384 of a
# sixth of it
STREAM_SETS = [(64, 3072), (384, 512)]


def stream(sets=STREAM_SETS) -> None:
    import torch.nn.functional as F

    if quant_kernels() is None:
        print(json.dumps({"bench": "quant_linear", "part": "stream", "skipped": "no AVX512-BF16 kernels here"}))
        return
    k, g = 576, torch.Generator().manual_seed(2)
    for calls, n in sets:
        layers = [Int4Linear(Int4Codes.quantize(torch.randn(n, k, generator=g) * 0.05), None) for _ in range(calls)]
        x = torch.randn(1, k, generator=g).to(torch.bfloat16)
        int4_bytes = sum(lin.nbytes for lin in layers)
        # fp32 over the same bytes in as many calls: 3/16 of the columns (4 bytes a weight against the
        # int4 layers' 3/4: half a byte of code, 8 bytes of float32 scale and offset a group of 32)
        dense = [torch.randn(n * 3 // 16, k, generator=g) for _ in range(calls)]
        xf = torch.randn(1, k, generator=g)
        fp32_bytes = sum(w.nbytes for w in dense)
        one = layers[0]  # the first layer as many times: its bytes stay in the caches (the work alone)
        for threads in (1, 2):
            torch.set_num_threads(threads)
            for kernel, run, nbytes in (
                ("int4", lambda layers=layers: [lin.native(x) for lin in layers], int4_bytes),
                ("fp32", lambda dense=dense: [F.linear(xf, w) for w in dense], fp32_bytes),
                ("int4_cached", lambda layers=layers: [one.native(x) for _ in layers], int4_bytes),
            ):
                ms = best_ms(run, 8)
                print(
                    json.dumps(
                        {
                            "bench": "quant_linear",
                            "part": "stream",
                            "kernel": kernel,
                            "calls": calls,
                            "bytes": nbytes,
                            "threads": threads,
                            "ms": round(ms, 4),
                            "gb_s": round(nbytes / ms / 1e6, 2),
                        }
                    ),
                    flush=True,
                )
        del layers, dense


def tile_ceiling() -> None:
    """tile_ceiling.cpp built with this machine's instruction set and run; its JSON lines as they come."""
    from runtime.cpu_kernels import cpu_flags

    missing = {"avx512_bf16", "avx512_vnni"} - cpu_flags()
    compiler = shutil.which("g++")
    if missing or compiler is None:
        why = f"this CPU lacks {sorted(missing)}" if missing else "no g++"
        print(json.dumps({"bench": "quant_linear", "part": "tile_ceiling", "skipped": why}))
        return
    source = Path(__file__).with_name("tile_ceiling.cpp")
    with tempfile.TemporaryDirectory() as tmp:
        binary = Path(tmp) / "tile_ceiling"
        subprocess.run([compiler, "-O3", "-march=native", str(source), "-o", str(binary)], check=True)
        print(subprocess.run([str(binary)], check=True, capture_output=True, text=True).stdout, end="", flush=True)


if __name__ == "__main__":
    main()
