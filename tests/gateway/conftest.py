"""Fixtures shared by the gateway's tests: the default model's vocabulary size (its grammar services
need it)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def vocab_size(smollm_dir):
    from runtime.model.loader import read_config

    return read_config(smollm_dir).vocab_size
