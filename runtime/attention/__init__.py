"""Attention over the slot-based KV pool: one contract (`base`), two backends, and the factory.

- base.py:           AttentionBackend, the contract every backend implements
- torch_backend.py:  TorchAttentionBackend (SDPA; CPU and CUDA)
- cascade.py:        shared-prefix (cascade) attention: prefix groups, attention with LSE, the merge
- triton_backend.py: TritonAttentionBackend and its kernels (CUDA; CPU under TRITON_INTERPRET=1)

The Triton backend is imported only when asked for: importing triton is slow, and the
interpreter must be switched on (TRITON_INTERPRET) before its kernels are defined.
"""

from __future__ import annotations

import importlib.util
import os

import torch

from runtime.attention.base import AttentionBackend
from runtime.attention.torch_backend import TorchAttentionBackend

ATTENTION_BACKENDS = ("auto", "torch", "triton")

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
    """`auto`: Triton on CUDA (when triton is installed), torch elsewhere. `triton` off CUDA runs
    only under the Triton interpreter (`TRITON_INTERPRET=1`, for tests)."""
    if name not in ATTENTION_BACKENDS:
        raise ValueError(f"attention_backend: must be one of {', '.join(ATTENTION_BACKENDS)}, not {name!r}")
    if name == "auto":
        name = "triton" if device.type == "cuda" and importlib.util.find_spec("triton") is not None else "torch"
    if name == "torch":
        return TorchAttentionBackend()
    if device.type != "cuda" and not triton_interpreter_enabled():
        raise ValueError(f"attention_backend=triton needs a CUDA device, not {device.type} "
                         "(on CPU it runs only under TRITON_INTERPRET=1, for tests)")
    from runtime.attention.triton_backend import TritonAttentionBackend

    return TritonAttentionBackend()
