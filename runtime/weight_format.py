"""Which linear-layer weight format a model runs in, and why (EngineConfig.weights: auto | fp32 | bf16 | q8 | q4).

`auto` on CPU: fp32, the only format that meets the whole accuracy bar: besides agreeing with
itself it keeps Jumpgate's equalities (jump-forward `verify` equals `off` token for token, a batch
equals each request alone, a prefix-cache hit equals a recompute, a stream equals the whole
response). The q4/q8/bf16 kernels multiply bf16 activations: fp32 attention differs in its last
bits between those cases (MKL's GEMMs are not invariant in the row count), a bf16 rounding of an
activation flips now and then, and at near-ties so does a token (on the dev box, with q4, 8 of 35
grammar cases differed between verify and off, and a streamed answer from its cached rerun).
`--weights q4` is the fast choice where that is acceptable: the GGUF's own Q4_1 weights through the
int4 kernel (nothing re-quantized; a decode step reads 1/8 of the fp32 bytes), `python -m bench
engine` measures it against fp32. What would make it the default: attention whose rows do not
depend on the rest of the pass (a batch-invariant kernel), and logits in fp32.
A q4 model runs every row through the int4 kernel: a bf16 copy of the same weights would prefill
~2x faster (the 120 layer linears at 512 rows: 136 ms bf16 against 303 ms int4 on the dev box,
/tmp microbenchmark, 2 threads), but it rounds each weight to bf16, so prompt tokens and generated
tokens would see slightly different weights; tried, it changed answers of the test prompts
("What is the capital of France?" no longer said Paris), so it was not kept.
On CUDA, `auto` keeps dense weights in the engine dtype.
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
    source = "; the GGUF's Q4_1 blocks are there for --weights q4" if gguf_q4 else ""
    return "fp32", (f"cpu: the exact reference, the only format whose greedy output does not change with "
                    f"batching, drafts or cache hits; --weights q4/bf16 are faster{source} ({cpu_summary()})")
