"""Every suite of `python -m bench` runs to its end (issue #42 item 8: `bench grammar` had stopped
at its second metric since the engine's stats became typed, and nothing noticed). Each suite runs
as `python -m bench SUITE --quick` in a subprocess, on what `make setup` installs, trimmed further
by the suite's own flags where it has them, so the whole file stays a few minutes of CI; the test
asks for exit status 0 and at least one JSON line. These keep the benches from rotting; the
figures are measured by hand. `engine` has its own test (tests/bench/test_bench_engine.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.__main__ import SUITES

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.e2e

# Each suite's smallest run that still goes through all of its code paths.
TRIM = {
    "cache": ["--workload", "agent-tools", "--workload", "cold-unique"],
    "cascade": ["--batch", "4", "--shared", "256", "--reps", "1"],
    "hicache": ["--prefixes", "2", "--rounds", "1", "--prefix-tokens", "256"],
    "grammar": [],
    "grammar_engines": ["--reps", "1"],
    "value_check": ["--reps", "1"],
    "serve": [
        "--requests",
        "2",
        "--max-tokens",
        "32",
        "--workloads",
        "agent-tools,responses-chain",
        "--kv-pool-tokens",
        "8192",
    ],
    "soak": ["--duration", "8", "--clients", "8", "--max-tokens", "32"],
    "validation": [],
    # The repo's own schemas: the other sources' packages are an optional extra (pyproject's `corpus`)
    "fidelity": ["--sources", "handmade", "--per-source", "1", "--mask-sample", "0"],
    "cluster": ["--requests", "4", "--prefix-tokens", "64", "--policies", "prefix,round_robin"],
    "batch": ["--requests", "4", "--max-tokens", "24"],
    "ttft": ["--lengths", "200", "--reps", "1", "--max-tokens", "4"],
}
COVERED_ELSEWHERE = {"engine"}


def test_every_suite_is_run_here_or_elsewhere():
    assert set(TRIM) | COVERED_ELSEWHERE == set(SUITES)


@pytest.mark.slow
@pytest.mark.parametrize("suite", sorted(TRIM))
def test_suite_runs_to_its_end(suite):
    # the default cache folder: a fresh one would convert the default GGUF again for every suite
    out = subprocess.run(
        [sys.executable, "-m", "bench", suite, "--quick", *TRIM[suite]],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        stdin=subprocess.DEVNULL,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert lines, out.stdout[-2000:] + out.stderr[-2000:]


def test_a_suite_that_raises_fails_the_run(tmp_path):
    """`python -m bench` exits non-zero when a suite raises, after printing what it raised, so a
    broken bench cannot pass CI silently (it exited 0 before)."""
    package = tmp_path / "bench_probe"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "broken.py").write_text(
        "def run(quick=False, argv=None):\n    print('{}')\n    raise TypeError('boom')\n"
    )
    script = (
        "import sys, bench.__main__ as m; m.SUITES['broken'] = 'bench_probe.broken'; sys.exit(m.main(sys.argv[1:]))"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    out = subprocess.run(
        [sys.executable, "-c", script, "broken", "--quick"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 1, out.stderr
    assert "TypeError: boom" in out.stderr and "bench broken: FAILED" in out.stderr
