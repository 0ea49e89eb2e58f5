"""`python -m bench engine` runs end to end on the real model and prints what it promises (the
bench is measured by hand; this only keeps it from rotting when the runtime's shape changes)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def expected_auto() -> str:
    import torch

    from runtime.attention import make_attention_backend
    from runtime.model.decoder import resolve_format
    from runtime.model.loader import resolve_model_dir

    cpu = torch.device("cpu")
    return resolve_format(
        resolve_model_dir(None), "auto", cpu, torch.float32, make_attention_backend("auto", cpu).batch_invariant
    )[0]


def expected_attention(weights: str) -> str:
    """The engine's attention backend by default for `weights` (AMX tiles where they can run)."""
    import torch

    from runtime.attention import make_attention_backend
    from runtime.attention.cpu_backend import tile_precision

    backend = make_attention_backend("auto", torch.device("cpu"))
    backend.enable_tiles(weights, tile_precision("auto"))
    return backend.name


@pytest.mark.e2e
@pytest.mark.slow
def test_engine_bench_quick_run_prints_the_split_and_the_ratios():
    out = subprocess.run(
        # 256-token prefills (--quick's are 1k): the keys and the split are the same, a fraction of the time
        [sys.executable, "-m", "bench", "--quick", "engine", "--formats", "fp32,q4,auto", "--prefill-tokens", "256"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    ref, chosen, auto = lines
    assert ref["weights"] == "fp32" and chosen["weights"] == "q4" and chosen["weights_reason"]
    assert ref["attention"] == expected_attention("fp32") in ("cpu", "torch")
    assert (
        chosen["attention"] == expected_attention("q4") in ("cpu", "cpu-amx", "cpu-amx-bf16", "cpu-bf16-dot", "torch")
    )
    # auto chose one of the two measured formats: reported, not measured again
    assert auto == {
        "bench": "engine",
        "requested": "auto",
        "weights": expected_auto(),
        "weights_reason": auto["weights_reason"],
    }
    for key in ("prefill_tok_s_256", "decode_tok_s_b1", "decode_tok_s_b16"):
        assert ref[key] > 0 and chosen[key] > 0
        assert chosen[f"{key}_vs_fp32"] == pytest.approx(chosen[key] / ref[key], rel=1e-3)  # emit rounds
    parts = ("step_linear_ms", "step_attention_ms", "step_other_model_ops_ms", "step_engine_ms")
    assert all(chosen[p] >= 0 for p in parts)
    assert sum(chosen[p] for p in parts) == pytest.approx(chosen["step_ms_b1"], rel=1e-3)
    assert 0 <= chosen["step_overhead_frac"] <= 1
    # the batch-16 pass: its linear and attention parts within the whole
    for line in (ref, chosen):
        assert 0 < line["forward_b16_linear_ms"] and 0 < line["forward_b16_attention_ms"]
        assert line["forward_b16_linear_ms"] + line["forward_b16_attention_ms"] <= line["forward_b16_ms"] * 1.001
    # the prefill split: its parts within the whole, and the ceiling is the reference over the attention
    for line in (ref, chosen):
        assert line["prefill_split_tokens"] == 256
        assert 0 < line["prefill_split_linear_ms"] and 0 < line["prefill_split_attention_ms"]
        assert line["prefill_split_linear_ms"] + line["prefill_split_attention_ms"] <= line["prefill_split_ms"] * 1.001
    assert chosen["prefill_split_ceiling_vs_fp32"] == pytest.approx(
        ref["prefill_split_ms"] / chosen["prefill_split_attention_ms"], rel=1e-3
    )


@pytest.mark.parametrize("value", ["0", "256,x", "5000"])
def test_bad_prefill_tokens_are_refused_before_any_engine(value, capsys):
    from bench.suites.engine import run

    with pytest.raises(SystemExit) as exit_info:
        run(quick=True, argv=["--prefill-tokens", value])
    assert exit_info.value.code == 2
    assert "--prefill-tokens" in capsys.readouterr().err
