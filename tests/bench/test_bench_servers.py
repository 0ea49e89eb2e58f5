"""bench/harness/server_process.py's server lifecycles beyond Jumpgate's own: vLLM's command line and
environment, a failed start reported under the server's name, and memory summed over the
processes the server started (vLLM's engine runs in a child)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.harness.server_process import MODEL, ServerFailed, VllmServer, session_pids


def test_vllm_command_serves_the_benchmarks_model_name_with_prefix_caching(tmp_path):
    server = VllmServer(
        tmp_path, "/opt/venv/bin/python", Path("/models/smol"), "bfloat16", kv_cache_gib=3, threads_bind="0-1"
    )
    cmd = server.command()
    assert cmd[:3] == ["/opt/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert cmd[cmd.index("--model") + 1] == "/models/smol"
    assert cmd[cmd.index("--served-model-name") + 1] == MODEL
    assert cmd[cmd.index("--dtype") + 1] == "bfloat16"
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1" and cmd[cmd.index("--port") + 1] == str(server.port)
    assert "--enable-prefix-caching" in cmd and "--enable-prompt-tokens-details" in cmd
    assert cmd[cmd.index("--tool-call-parser") + 1] == "hermes"  # tool_choice "required" needs one
    assert server.env()["VLLM_CPU_KVCACHE_SPACE"] == "3" and server.env()["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"
    # unless asked, vLLM's own choice (whatever the caller's environment says)
    default = VllmServer(tmp_path, "python", tmp_path, "float32").env()
    assert default.get("VLLM_CPU_OMP_THREADS_BIND") == os.environ.get("VLLM_CPU_OMP_THREADS_BIND")


def test_a_server_that_exits_at_start_is_reported_under_its_name(tmp_path):
    # an interpreter without vllm: the module is missing and the process exits at once
    server = VllmServer(tmp_path, sys.executable, tmp_path, "float32", startup_timeout_s=60)
    with pytest.raises(ServerFailed, match=r"^vllm exited with 1") as failed:
        server.start()
    assert "vllm" in str(failed.value)  # the log tail names what was missing
    assert server.proc is None  # stopped: nothing left running


def testsession_pids_include_the_children_of_what_was_started():
    proc = subprocess.Popen(["sh", "-c", "sleep 30 & sleep 30 & wait"], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        pids = session_pids(proc.pid)
        while len(pids) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
            pids = session_pids(proc.pid)
        assert proc.pid in pids and len(pids) == 3, pids  # the shell and its two sleeps
        assert os.getpid() not in pids
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the group this test started, by its id
        proc.wait(timeout=10)
