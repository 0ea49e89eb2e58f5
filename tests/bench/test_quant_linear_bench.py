"""`python -m bench.probes.quant_linear_bench --stream` prints what it promises: a line per (kernel, calls,
threads) whose bytes a second are the bytes it read over the time it took (the bench is run by hand;
this keeps it from rotting)."""

from __future__ import annotations

import json

import pytest
import torch

from bench.probes.quant_linear_bench import stream
from runtime.model.linear import quant_kernels


def test_stream_reports_both_kernels_at_one_and_two_threads(capsys):
    threads = torch.get_num_threads()
    try:
        stream([(3, 64)])
    finally:
        torch.set_num_threads(threads)
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    if quant_kernels() is None:
        assert lines == [{"bench": "quant_linear", "part": "stream", "skipped": "no AVX512-BF16 kernels here"}]
        return
    assert [(d["kernel"], d["threads"]) for d in lines] == [
        (k, t) for t in (1, 2) for k in ("int4", "fp32", "int4_cached")
    ]
    # 3 layers of 64 x 576: int4 codes (half a byte a weight) and float32 scale and offset a group of
    # 32; fp32 over 3/16 of the columns, the same bytes
    assert {d["bytes"] for d in lines} == {3 * 64 * 576 * 3 // 4}
    for d in lines:
        assert d["calls"] == 3 and d["ms"] > 0
        # both rounded (gb_s to 0.01: on a loaded host a slow call reads as 0.00)
        assert d["gb_s"] == pytest.approx(d["bytes"] / d["ms"] / 1e6, rel=0.02, abs=0.006)
