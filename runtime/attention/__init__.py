"""Attention over the slot-based KV pool: one contract (`base`), two backends, and the factory.

- base.py:           AttentionBackend, the contract every backend implements
- torch_backend.py:  TorchAttentionBackend (SDPA; CPU and CUDA)
- cpu_backend.py:    CpuPagedAttentionBackend (a batch-invariant C++ kernel; CPU, float32)
  (its kernel, runtime/cpu_kernels/paged_attention.cpp, is built on first use, cached per machine)
- cascade.py:        shared-prefix (cascade) attention: prefix groups, attention with LSE, the merge
- triton_backend.py: TritonAttentionBackend, its launchers and metadata (CUDA; CPU under TRITON_INTERPRET=1)
- triton_kernels.py: the Triton kernels themselves (extend, split-K decode, shared prefix, merge)

The Triton backend is imported only when asked for: importing triton is slow, and the
interpreter must be switched on (TRITON_INTERPRET) before its kernels are defined.
"""

from __future__ import annotations

import importlib.util
import os

import torch

from runtime.attention.base import AttentionBackend
from runtime.attention.torch_backend import TorchAttentionBackend

ATTENTION_BACKENDS = ("auto", "torch", "triton", "cpu")

__all__ = [
    "ATTENTION_BACKENDS",
    "AttentionBackend",
    "TorchAttentionBackend",
    "make_attention_backend",
    "triton_interpreter_enabled",
]


def triton_interpreter_enabled() -> bool:
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("1", "true", "yes", "on")


def make_attention_backend(name: str, device: torch.device) -> AttentionBackend:
    """`auto`: Triton on CUDA (when triton is installed), the cpu kernel on CPU (torch where it
    cannot be built), torch elsewhere. `cpu` falls back to torch the same way (one log line).
    `triton` off CUDA runs only under the Triton interpreter (`TRITON_INTERPRET=1`, for tests)."""
    if name not in ATTENTION_BACKENDS:
        raise ValueError(f"attention_backend: must be one of {', '.join(ATTENTION_BACKENDS)}, not {name!r}")
    if name == "auto":
        if device.type == "cuda":
            name = "triton" if importlib.util.find_spec("triton") is not None else "torch"
        else:
            name = "cpu" if device.type == "cpu" else "torch"  # batch invariant: see cpu_backend.py
    if name == "cpu":
        if device.type != "cpu":
            raise ValueError(f"attention_backend=cpu runs on CPU only, not {device.type}")
        from runtime.attention.cpu_backend import CpuPagedAttentionBackend
        from runtime.cpu_kernels import load_cpu_kernels

        ext = load_cpu_kernels()
        return CpuPagedAttentionBackend(ext) if ext is not None else TorchAttentionBackend()
    if name == "torch":
        return TorchAttentionBackend()
    if device.type != "cuda" and not triton_interpreter_enabled():
        raise ValueError(
            f"attention_backend=triton needs a CUDA device, not {device.type} "
            "(on CPU it runs only under TRITON_INTERPRET=1, for tests)"
        )
    from runtime.attention.triton_backend import TritonAttentionBackend

    return TritonAttentionBackend()
