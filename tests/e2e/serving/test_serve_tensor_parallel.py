"""`jumpgate serve --tensor-parallel-size 2` (issue #45 item 4): the real CLI with a tiny random
Llama split across two CPU processes (gloo) answers a chat request over HTTP, and once the server
stops its worker is gone too (and, with JUMPGATE_TP_E2E=1, once the server is killed). (A worker that dies under a request:
tests/runtime/parallel/test_tensor_parallel.py, and the 503 it maps to: tests/gateway/test_gateway_errors.py.)"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from bench.harness.server_process import JumpgateServer
from tests.runtime.parallel.test_tensor_parallel import running


@pytest.fixture(scope="module")
def tp_model(tiny_model_dir):
    return tiny_model_dir  # the session's tiny Llama (tests/conftest.py): 2 KV heads, one a rank


def workers_of(pid: int) -> list[int]:
    """The server's tensor-parallel workers (`python -m runtime.parallel.worker` children)."""
    kids = []
    for task in Path(f"/proc/{pid}/task").iterdir():  # each thread's own children (rank 0 spawns from the engine's)
        kids += [int(p) for p in (task / "children").read_text().split()]
    return [k for k in kids if b"runtime.parallel.worker" in Path(f"/proc/{k}/cmdline").read_bytes()]


def wait_gone(pids: list[int], timeout_s: float = 20.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(running(p) for p in pids):
        time.sleep(0.2)
    return [p for p in pids if running(p)]


def test_serve_with_two_ranks_answers_and_its_workers_end_with_it(tmp_path, tp_model):
    args = ["--model", str(tp_model), "--tensor-parallel-size", "2", "--weights", "fp32"]
    args += ["--attention-backend", "torch", "--num-threads", "1"]
    server = JumpgateServer(tmp_path, kv_pool_tokens=512, extra_args=args).start()
    try:
        workers = workers_of(server.pid)
        assert len(workers) == 1, "rank 0 should have started one worker"
        body = {"model": tp_model.name, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
        with httpx.Client(base_url=server.url, timeout=120) as http:
            ok = http.post("/v1/chat/completions", json={**body, "temperature": 0})
        assert ok.status_code == 200, ok.text
        assert ok.json()["usage"]["completion_tokens"] == 4
    finally:
        server.stop()
    assert not wait_gone(workers), "a tensor-parallel worker outlived the server"


@pytest.mark.skipif(not os.environ.get("JUMPGATE_TP_E2E"), reason="a second server start (~25 s): JUMPGATE_TP_E2E=1")
def test_serve_with_two_ranks_killed_leaves_no_orphan(tmp_path, tp_model):
    args = ["--model", str(tp_model), "--tensor-parallel-size", "2", "--weights", "fp32"]
    args += ["--attention-backend", "torch", "--num-threads", "1"]
    server = JumpgateServer(tmp_path, kv_pool_tokens=512, extra_args=args).start()
    workers = workers_of(server.pid)
    try:
        os.kill(server.pid, signal.SIGKILL)  # rank 0 gone without a word: its workers see the pipe close
    finally:
        server.stop()
    assert workers and not wait_gone(workers)
