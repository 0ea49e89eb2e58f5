"""Every bench is reachable (issue #43 item 5): bench/ holds its entry point and packages only, a
module of bench/suites/ (or of its groups kvcache/, structured/) is the suite of `python -m bench` of
its name, a module of bench/probes/ is a listed probe, and `python -m bench --help` names each with
its line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bench.__main__ import PROBES, SUITE_HELP, SUITES

ROOT = Path(__file__).resolve().parents[2]
# The packages of bench/: suites (one suite a module), probes, and what they share.
PACKAGES = {"suites", "probes", "harness", "fidelity", "results"}


def test_bench_holds_only_its_entry_point_and_its_packages():
    modules = {p.stem for p in (ROOT / "bench").glob("*.py")}
    assert modules == {"__init__", "__main__"}, f"a module at the top of bench/: {sorted(modules)}"
    folders = {p.name for p in (ROOT / "bench").iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == PACKAGES


# The groups of bench/suites/: suites of one concern together, so no package holds more than 12 modules.
SUITE_GROUPS = {"kvcache", "structured"}


def test_every_module_of_suites_is_a_suite_named_like_its_module():
    suites_dir = ROOT / "bench" / "suites"
    groups = {p.name for p in suites_dir.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert groups == SUITE_GROUPS
    modules = {
        ".".join(p.relative_to(ROOT).with_suffix("").parts)
        for p in suites_dir.rglob("*.py")
        if p.stem != "__init__" and "__pycache__" not in p.parts
    }
    suites = set(SUITES.values())
    assert all(module.rsplit(".", 1)[1] == name for name, module in SUITES.items())
    assert modules == suites, (
        f"not a suite: {sorted(modules - suites)}, missing: {sorted(suites - modules)} (list it in bench/__main__.py's SUITES and SUITE_HELP and "
        "in tests/bench/test_bench_suites.py's TRIM, or move it to bench/probes/ and PROBES, or to bench/harness/)"
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
