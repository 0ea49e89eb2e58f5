"""Which linear-layer weight format a model runs in, and why (EngineConfig.weights: auto | fp32 | bf16 | q8 | q4).

`auto` on CPU: the q4/q8/bf16 kernels all multiply bf16 activations, which pays only where the
CPU does bf16 natively (AVX512-BF16 or AMX). There: q4 when the model's linear weights are GGUF
Q4_1 blocks (q4 then holds the file's own weights: nothing is re-quantized, only activations and
block scales are rounded to bf16, and a decode step reads 1/8 of the fp32 bytes), else bf16.
Without native bf16 (e.g. AVX2 only), fp32: there bf16 is converted in software (on the AVX2 dev
box q4 decoded faster at batch 1 but prefilled slower, see `python -m bench engine`), and fp32 is
the exact reference whose greedy output does not depend on batch composition. On CUDA, `auto` keeps dense weights in the engine dtype.
The accuracy of each format against fp32 is measured by tests/test_weight_formats.py.
"""

from __future__ import annotations

from functools import lru_cache

import torch

from runtime.model_config import ModelLoadError

WEIGHT_FORMATS = ("auto", "fp32", "bf16", "q8", "q4")
QUANTIZED = ("q8", "q4")
DTYPE_FORMATS = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
FORMAT_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags from /proc/cpuinfo (empty where there is no such file)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def native_bf16() -> bool:
    """Whether oneDNN has a bf16 matmul path on this CPU (without one, bf16 is converted and slow)."""
    return bool(cpu_flags() & {"avx512_bf16", "amx_bf16"})


def cpu_summary() -> str:
    flags = cpu_flags()
    have = [f for f in ("avx512_bf16", "amx_bf16", "avx512_vnni", "avx_vnni", "avx512f", "avx2") if f in flags]
    return f"torch cpu capability {torch.backends.cpu.get_cpu_capability()}, flags: {' '.join(have) or 'none'}"


def choose_format(requested: str, device: torch.device, dtype: torch.dtype, gguf_q4: bool) -> tuple[str, str]:
    """(format, reason). `gguf_q4`: the source has GGUF Q4_1 blocks for the linear layers."""
    if requested not in WEIGHT_FORMATS:
        raise ModelLoadError(f"weights: unknown format {requested!r} (one of: {', '.join(WEIGHT_FORMATS)})")
    if requested != "auto":
        if requested in QUANTIZED and device.type != "cpu":
            raise ModelLoadError(f"weights: {requested} runs on CPU kernels only; on {device.type} use fp32 or bf16")
        source = " (the GGUF's own Q4_1 blocks)" if requested == "q4" and gguf_q4 else ""
        return requested, f"requested{source}"
    if device.type != "cpu":
        fmt = DTYPE_FORMATS.get(dtype, str(dtype))
        return fmt, f"{device.type}: dense weights in the engine dtype"
    if not native_bf16():
        return "fp32", (f"cpu without native bf16: the bf16-activation kernels convert in software and prefill "
                        f"slower; fp32 is exact ({cpu_summary()})")
    if gguf_q4:
        return "q4", f"cpu with native bf16: the GGUF's own Q4_1 weights through the int4 kernel ({cpu_summary()})"
    return "bf16", f"cpu with native bf16, no GGUF 4-bit weights: bf16 matmul ({cpu_summary()})"
