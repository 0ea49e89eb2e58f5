"""Which linear-layer weight format a model runs in, and why (EngineConfig.weights: auto | fp32 | bf16 | q8 | q4).

`auto` on CPU: q4 where the CPU has native bf16 (avx512_bf16 or amx_bf16, where the int4 and bf16
kernels are fast) or else AVX2 + FMA (where q4's layers run runtime/cpu_kernels/quant_linear_i8.cpp:
the GGUF's 4-bit codes times activations coded as two int8 digits, on integer dot products, and its
logits layer quant_linear_f32.cpp: the Q8_0 codes, float32 activations), the source is a GGUF with
quantized layer blocks q4 runs as stored (Q4_1; the K-quants Q4_K, Q5_K, Q6_K of a Q4_K_M file and
its Q5_0/Q5_1/Q8_0 fallbacks, runtime/model/gguf_blocks.py; wider than 4 bits on the int8 kernel
where AVX512-BF16 is, else as dense copies), the engine dtype is float32 and the attention backend is batch-invariant (the cpu backend, runtime/attention/cpu_backend.py); fp32
elsewhere. q4 is the GGUF's own Q4_1 weights through the int4 kernel (nothing re-quantized; a
decode step reads 1/8 of the fp32 bytes) with the tied embedding's own Q8_0 codes as the logits layer; `python -m bench engine`
measures it against fp32, tests/runtime/model/test_weight_formats.py bounds its drift from fp32 (greedy top-1
agreement >= 97%).
Why the attention condition: the q4/q8/bf16 kernels multiply bf16 activations, so a last-bit
difference in an fp32 input is now and then rounded to another bf16 value, and at near-ties that
flips a token. Jumpgate's equalities (jump-forward `verify` equals `off` token for token, a batch
equals each request alone, a prefix-cache hit equals a recompute, logprobs equal a recompute)
need every row computed with the same bits whatever else is in the pass. The int4 kernel and the
bf16 F.linear are row-count invariant; SDPA over gathered, padded or cascade-merged K/V is not
(with the torch backend, 8 of 35 grammar cases differed between verify and off on the dev box),
the cpu backend's kernel is. fp32 keeps the equalities under either backend: its differences stay
in the last bits (fp32 BLAS is not row-count invariant, but nothing rounds them up to a token).
`--weights fp32` is the unquantized reference; `--weights q4` forces q4 (also under the torch
backend or without native bf16, where the equalities or the speed may not hold).
A q4 model runs every row, prompt and generated alike, through one int4 kernel
(runtime/cpu_kernels/quant_linear.cpp where the CPU has AVX512-BF16, on AMX tiles where it has AMX: the codes straight into bf16
dot products, one fixed order per row for every row count). An earlier try ran prompt rows through
a bf16 copy of the weights (2x faster than aten's int4 kernel then), but rounding each weight to
bf16 made prompt and generated tokens see slightly different weights and changed answers of the
test prompts ("What is the capital of France?" no longer said Paris), so it was not kept; the
kernel now gives prompt rows that speed with the GGUF's own weights.
On CUDA, `auto` keeps dense weights in the engine dtype.
"""

from __future__ import annotations

import torch

from runtime.cpu_kernels import cpu_flags
from runtime.model.config import ModelLoadError

WEIGHT_FORMATS = ("auto", "fp32", "bf16", "q8", "q4")
QUANTIZED = ("q8", "q4")
DTYPE_FORMATS = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
FORMAT_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def cpu_summary() -> str:
    flags = cpu_flags()
    have = [f for f in ("avx512_bf16", "amx_bf16", "avx512_vnni", "avx_vnni", "avx512f", "avx2") if f in flags]
    return f"torch cpu capability {torch.backends.cpu.get_cpu_capability()}, flags: {' '.join(have) or 'none'}"


NATIVE_BF16 = ("avx512_bf16", "amx_bf16")  # CPU flags under which the bf16/int4 kernels are fast
AVX2_KERNELS = ("avx2", "fma")  # CPU flags the integer int4 and float32 int8 kernels need (all of them)
AMX_TILES = ("amx_tile", "amx_bf16")  # CPU flags under which the bf16 kernels run on tiles (all of them)


def choose_format(
    requested: str, device: torch.device, dtype: torch.dtype, gguf_q4: bool, invariant_attention: bool = False
) -> tuple[str, str]:
    """(format, reason). `gguf_q4`: the source has GGUF blocks for the linear layers that q4 runs as
    stored (Q4_1, K-quants, ...; runtime/model/loader.py's `read_gguf_codes`).
    `invariant_attention`: the attention backend's rows do not depend on the rest of the pass."""
    if requested not in WEIGHT_FORMATS:
        raise ModelLoadError(f"weights: unknown format {requested!r} (one of: {', '.join(WEIGHT_FORMATS)})")
    if requested != "auto":
        if requested in QUANTIZED and device.type != "cpu":
            raise ModelLoadError(f"weights: {requested} runs on CPU kernels only; on {device.type} use fp32 or bf16")
        source = " (the GGUF's own blocks)" if requested == "q4" and gguf_q4 else ""
        return requested, f"requested{source}"
    if device.type != "cpu":
        fmt = DTYPE_FORMATS.get(dtype, str(dtype))
        return fmt, f"{device.type}: dense weights in the engine dtype"
    native = any(f in cpu_flags() for f in NATIVE_BF16)
    avx2_kernels = all(f in cpu_flags() for f in AVX2_KERNELS)
    if gguf_q4 and (native or avx2_kernels) and invariant_attention and dtype == torch.float32:
        tiles = " on AMX tiles" if all(f in cpu_flags() for f in AMX_TILES) else ""
        kernel = (
            f"cpu with native bf16: the GGUF's own blocks through the bf16 int4 kernel{tiles} (wider codes: int8)"
            if native
            else "cpu without native bf16 (AVX2 + FMA): the GGUF's own 4-bit blocks on integer dot products, "
            "activations coded as two int8 digits (15 bits)"
        )
        return "q4", (
            f"{kernel}, with batch-invariant attention, so batching, drafts and cache hits do not change "
            f"the output; --weights fp32 is the unquantized reference ({cpu_summary()})"
        )
    why = (
        "the source has no GGUF blocks q4 runs as stored (Q4_1, Q4_K, Q5_K, Q6_K, ...)"
        if not gguf_q4
        else "neither native bf16 nor AVX2 + FMA on this CPU"
        if not (native or avx2_kernels)
        else "the attention backend is not batch-invariant"
        if not invariant_attention
        else f"the engine dtype is {dtype}, not float32"
    )
    return "fp32", (
        f"cpu: the exact reference, whose greedy output does not change with batching, drafts or "
        f"cache hits; not q4: {why} ({cpu_summary()})"
    )
