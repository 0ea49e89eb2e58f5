"""Every bench is reachable (issue #43 item 5): a module of bench/ is a suite of `python -m bench`
or one of the suites' helpers, a module of bench/probes/ is a listed probe, and `python -m bench
--help` names each with its line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bench.__main__ import PROBES, SUITE_HELP, SUITES

ROOT = Path(__file__).resolve().parents[2]
# Modules the suites import, not benches themselves.
HELPERS = {
    "__init__",
    "__main__",
    "common",
    "fidelity_classify",
    "fidelity_client",
    "fidelity_corpus",
    "fidelity_tally",
    "replica_killer",
    "server_process",
    "workloads",
}


def test_every_bench_module_is_a_suite_or_a_helper():
    suites = {module.removeprefix("bench.") for module in SUITES.values()}
    modules = {p.stem for p in (ROOT / "bench").glob("*.py")}
    assert modules - HELPERS == suites, (
        f"not a suite: {sorted(modules - HELPERS - suites)} (list it in bench/__main__.py's SUITES and SUITE_HELP and "
        "in tests/bench/test_bench_suites.py's TRIM, or move it to bench/probes/ and PROBES, or add a helper to HELPERS)"
    )


def test_every_probe_is_listed():
    probes = {p.stem for p in (ROOT / "bench" / "probes").glob("*.py")} - {"__init__"}
    assert probes == set(PROBES)


def test_help_lists_every_suite_and_probe_with_its_line():
    assert set(SUITE_HELP) == set(SUITES)
    out = subprocess.run(
        [sys.executable, "-m", "bench", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    for name, line in [*SUITE_HELP.items(), *PROBES.items()]:
        assert any(row.split() == [name, *line.split()] for row in lines), name
