"""The Triton kernel modules as a fixture, imported lazily (only the Triton tests need triton), after
`tests/conftest.py` has turned the interpreter on where there is no GPU."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from runtime.attention import triton_interpreter_enabled
from tests.runtime.attention.triton_helpers import ON_GPU


@pytest.fixture(scope="module")
def kernels():
    """The kernel modules, imported lazily (only these tests need triton)."""
    if not ON_GPU and not triton_interpreter_enabled():
        pytest.skip("no GPU and TRITON_INTERPRET is off: Triton kernels cannot run here")
    from triton.runtime.interpreter import InterpretedFunction

    from runtime.attention import triton_backend
    from runtime.decode import triton_bitmask
    from runtime.model import cuda_graphs

    interpreted = isinstance(triton_backend.extend_kernel, InterpretedFunction)
    assert interpreted == (not ON_GPU), "kernel modules were imported before TRITON_INTERPRET was set"
    return SimpleNamespace(attn=triton_backend, bitmask=triton_bitmask, graphs=cuda_graphs)
