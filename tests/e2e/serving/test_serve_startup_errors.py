"""`jumpgate serve` that cannot start says why in one line and exits non-zero, with no traceback
(issue #42 item 7): the real CLI in a subprocess, one failure kind per case. None of these loads
the default model, which is why each answers in seconds."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def start(tmp_path: Path, *argv: str, cache_dir: Path | None = None) -> subprocess.CompletedProcess:
    """`jumpgate serve ARGV` with its default folders under tmp_path (never the user's own)."""
    env = {
        **os.environ,
        "JUMPGATE_CACHE_DIR": str(cache_dir or tmp_path / "cache"),
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p),
    }
    return subprocess.run(
        [sys.executable, "-m", "gateway", "serve", "--host", "127.0.0.1", *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )


def one_error_line(out: subprocess.CompletedProcess) -> str:
    """The failure's single stderr line, after checking the exit status and that nothing else was said."""
    assert out.returncode != 0, out.stdout[-2000:]
    assert "Traceback" not in out.stderr, out.stderr[-4000:]
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, out.stderr[-4000:]
    assert lines[0].startswith("jumpgate serve: error: "), lines[0]
    return lines[0]


def unsupported_model(folder: Path) -> Path:
    """A Hugging Face folder in shape whose architecture Jumpgate does not run."""
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "gpt_neox", "architectures": ["GPTNeoXForCausalLM"]}))
    (folder / "model.safetensors").write_bytes(b"")
    (folder / "tokenizer.json").write_text("{}")
    return folder


SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "phi3")  # runtime/model/families/registry.py


def test_unsupported_model(tmp_path):
    line = one_error_line(start(tmp_path, "--model", str(unsupported_model(tmp_path / "neox")), "--port", "0"))
    assert "gpt_neox" in line and "unsupported architecture" in line
    assert all(name in line for name in SUPPORTED_MODEL_TYPES), line


def test_unsupported_gguf_architecture(tmp_path):
    """A GGUF file of an architecture no family reads: refused before any tensor is converted."""
    import gguf
    import numpy as np

    path = tmp_path / "tiny-gemma.gguf"
    writer = gguf.GGUFWriter(str(path), "gemma")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    line = one_error_line(start(tmp_path, "--model", str(path), "--port", "0"))
    assert "unsupported GGUF architecture 'gemma'" in line and "qwen3" in line, line


def test_missing_model(tmp_path):
    line = one_error_line(start(tmp_path, "--model", str(tmp_path / "nowhere"), "--port", "0"))
    assert str(tmp_path / "nowhere") in line and "no such model" in line


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--port", "70000"], "--port"),  # a bound the settings check
        (["--jump-forward", "sideways"], "--jump-forward"),  # a choice argparse checks
        (["--max-n", "many"], "--max-n"),  # not a number
    ],
)
def test_bad_flag_value(tmp_path, argv, named):
    out = start(tmp_path, *argv)
    assert out.returncode == 2  # as argparse: a usage error
    assert named in one_error_line(out)


def test_port_in_use(tmp_path):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        line = one_error_line(start(tmp_path, "--port", str(port)))
    assert f"--port {port}" in line and "in use" in line


@pytest.mark.parametrize("flag", ["--grammar-cache-dir", "--registry-dir", "--disk-cache-dir"])
def test_folder_it_cannot_write(tmp_path, flag):
    """A path under a plain file can never be a folder (whoever runs the test, root included)."""
    (tmp_path / "plain-file").write_text("")
    bad = tmp_path / "plain-file" / "sub"
    tier = ["--host-pool-tokens", "4096"] if flag == "--disk-cache-dir" else []  # the disk tier needs the host tier
    line = one_error_line(start(tmp_path, "--port", "0", *tier, flag, str(bad)))
    assert f"{flag} {bad}" in line and "cannot write" in line


def test_default_folders_it_cannot_write(tmp_path):
    """No folder flags: the defaults under $JUMPGATE_CACHE_DIR are checked the same way."""
    (tmp_path / "plain-file").write_text("")
    line = one_error_line(start(tmp_path, "--port", "0", cache_dir=tmp_path / "plain-file" / "jumpgate"))
    assert str(tmp_path / "plain-file") in line and "cannot write" in line
