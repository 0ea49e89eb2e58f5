"""Builds and loads Jumpgate's C++ CPU kernels once per machine: `torch.ops.jumpgate_cpu`.

- paged_attention.cpp: batch-invariant paged attention over the KV pool (runtime/attention/cpu_backend.py),
  its path on AMX tiles (paged_attention_tiles.h, _bf16.h, _tile_loop.h) and its bf16 dot-product
  scores without AMX (paged_attention_dot.h);
- layer_ops.cpp: a decoder layer's small ops fused for the q4/q8/bf16 formats, in bf16 or float32
  activations (runtime/model/decoder.py);
- quant_linear.cpp: the q4 format's linear and logits layers (the GGUF's int4 and int8 codes) on
  bf16 dot-product instructions (AVX512-BF16; runtime/model/linear.py);
- quant_linear_f32.cpp: the same with float32 activations, on AVX2 + FMA (CPUs without native bf16);
- quant_linear_i8.cpp: the int4 layers on integer dot products (activations as two int8 digits), on AVX2 + FMA;
- decoder_layers.cpp: all decoder layers of a pass in one call (the fused formats' layer loop, runtime/model/decoder.py),
  calling the kernels above through ops.h, their C++ entry points;
- vec.h: the vector helpers the others use (16 lanes with AVX-512, else 8);
- amx.h: whether this process may use AMX tiles (paged_attention.cpp and quant_linear.cpp use them).

The extension is compiled on first use with `-O3 -march=native -fopenmp` into
$JUMPGATE_CACHE_DIR/ext/ (default ~/.cache/jumpgate/ext/), in a folder keyed by the sources' hash,
the torch version, the CPU's flags and the compiler flags, so an upgrade or another CPU gets its
own build and a later process only loads it (the .so, without running the build tool). Builds are
serialized by an flock that dies with its holder: a build killed midway (a test timeout, Ctrl-C)
would otherwise leave cpp_extension's own lock file behind, and every later start would wait on
it forever. The key includes this folder's path, so two checkouts never rebuild each other's
files. Without a compiler, or when the build fails,
`load_cpu_kernels` returns None after one log line; callers then use plain torch ops. The kernels
are dispatcher ops (`torch.ops.jumpgate_cpu.paged_attention`, ...), so the profiler reports them
by name.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import logging
import threading
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger("jumpgate.attention")


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags from /proc/cpuinfo (empty where there is no such file): what the
    kernels are built for, and what the weight format choice reads (runtime/model/weight_format.py)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


FOLDER = Path(__file__).parent
SOURCES = (
    FOLDER / "paged_attention.cpp",
    FOLDER / "layer_ops.cpp",
    FOLDER / "quant_linear.cpp",
    FOLDER / "quant_linear_f32.cpp",
    FOLDER / "quant_linear_i8.cpp",
    FOLDER / "decoder_layers.cpp",
)
HEADERS = (
    FOLDER / "vec.h",
    FOLDER / "amx.h",
    FOLDER / "paged_attention_tiles.h",
    FOLDER / "paged_attention_bf16.h",
    FOLDER / "paged_attention_tile_loop.h",
    FOLDER / "paged_attention_dot.h",
    FOLDER / "ops.h",
    FOLDER / "quant_linear_tile.h",
)
# -fopenmp: at::parallel_for is a header template around `#pragma omp parallel`, serial without it;
# the .so then needs libgomp.so.1, which resolves to the copy torch has already loaded (one team).
# cpp_extension.load appends to the lists it is given, so it gets copies (the key hashes these).
CFLAGS = ("-O3", "-march=native", "-fopenmp")
LDFLAGS = ("-fopenmp",)

_lock = threading.Lock()
# the kernels this process built or loaded, by build key (a test may swap in {} to force a build)
loaded: dict[str, Any] = {}
OP_NAME = "jumpgate_cpu::paged_attention"


@functools.lru_cache(maxsize=1)
def build_key() -> str:
    """Read once per process: torch cannot load a second library defining the same ops, so a
    process keeps the build it started with even if the sources change under it (an edit during
    a test run would otherwise abort it)."""
    h = hashlib.sha256()
    for path in SOURCES + HEADERS:
        h.update(path.read_bytes())
    h.update(torch.__version__.encode())
    h.update(" ".join(sorted(cpu_flags())).encode())
    h.update(" ".join(CFLAGS + LDFLAGS).encode())
    h.update(str(FOLDER.resolve()).encode())  # ninja's build file names the sources by path
    return h.hexdigest()[:16]


def build_dir() -> Path:
    from runtime.model.loader import cache_root

    return cache_root() / "ext" / f"cpu_kernels-{build_key()}"


def load_cpu_kernels() -> Any:
    """The op namespace `torch.ops.jumpgate_cpu`, or None where it cannot be built (logged once per process)."""
    key = build_key()
    with _lock:
        if key not in loaded:
            loaded[key] = _build(key)
        return loaded[key]


def _build(key: str) -> Any:
    folder = build_dir()
    try:
        from torch.utils import cpp_extension

        folder.mkdir(parents=True, exist_ok=True)
        name = f"jumpgate_cpu_{key}"
        with open(folder / "jumpgate.flock", "w") as guard:
            fcntl.flock(guard, fcntl.LOCK_EX)  # released when this process ends, however it ends
            library = folder / f"{name}.so"
            if library.exists():
                try:
                    torch.ops.load_library(str(library))
                    return torch.ops.jumpgate_cpu
                except OSError:  # cut short by a killed link: build it again
                    library.unlink()
            (folder / "lock").unlink(missing_ok=True)  # cpp_extension's, left by a killed build
            cpp_extension.load(
                name=name,
                sources=[str(s) for s in SOURCES],
                extra_cflags=list(CFLAGS),
                extra_ldflags=list(LDFLAGS),
                extra_include_paths=[str(FOLDER)],
                build_directory=str(folder),
                verbose=False,
                is_python_module=False,
            )
        return torch.ops.jumpgate_cpu
    except Exception as e:  # no compiler, no ninja, a failed build: the torch ops still work
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        log.warning(
            "cpu kernels unavailable (%s: %s); using the torch backend and plain torch ops", type(e).__name__, first
        )
        return None
