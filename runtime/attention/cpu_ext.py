"""Builds and loads the CPU attention kernel (cpu_paged.cpp) once per machine.

The extension is compiled on first use with `-O3 -march=native` into
$JUMPGATE_CACHE_DIR/ext/ (default ~/.cache/jumpgate/ext/), in a folder keyed by the source's hash,
the torch version and the CPU's flags, so an upgrade or another CPU gets its own build and a later
process only loads it. Without a compiler, or when the build fails, `load_cpu_attention` returns
None after one log line; the factory then uses the torch backend. The kernel is the dispatcher op
`torch.ops.jumpgate_cpu.paged_attention` (the profiler reports it under that name).
"""

from __future__ import annotations

import hashlib
import logging
import threading
from pathlib import Path
from typing import Any

import torch

from runtime.weight_format import cpu_flags

log = logging.getLogger("jumpgate.attention")

SOURCE = Path(__file__).with_name("cpu_paged.cpp")
CFLAGS = ["-O3", "-march=native"]

_lock = threading.Lock()
_loaded: dict[str, Any] = {}
OP_NAME = "jumpgate_cpu::paged_attention"


def build_key() -> str:
    h = hashlib.sha256(SOURCE.read_bytes())
    h.update(torch.__version__.encode())
    h.update(" ".join(sorted(cpu_flags())).encode())
    h.update(" ".join(CFLAGS).encode())
    return h.hexdigest()[:16]


def build_dir() -> Path:
    from runtime.loader import cache_root

    return cache_root() / "ext" / f"cpu_attention-{build_key()}"


def load_cpu_attention() -> Any:
    """The op namespace holding `paged_attention`, or None where it cannot be built (logged once per process)."""
    key = build_key()
    with _lock:
        if key not in _loaded:
            _loaded[key] = _build(key)
        return _loaded[key]


def _build(key: str) -> Any:
    folder = build_dir()
    try:
        from torch.utils import cpp_extension

        folder.mkdir(parents=True, exist_ok=True)
        cpp_extension.load(name=f"jumpgate_cpu_attention_{key}", sources=[str(SOURCE)], extra_cflags=CFLAGS,
                           build_directory=str(folder), verbose=False, is_python_module=False)
        return torch.ops.jumpgate_cpu
    except Exception as e:  # no compiler, no ninja, a failed build: the torch backend still works
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        log.warning("cpu attention kernel unavailable (%s: %s); using the torch backend", type(e).__name__, first)
        return None
