"""A Ray Serve replica that is a tensor-parallel group (issue #45 item 4): `jumpgate serve --replicas 1
--tensor-parallel-size 2` as a real process, a tiny random Llama split across the replica actor
(rank 0) and one worker process (gloo), answers a strict request over HTTP through Serve's proxy,
and once the server stops its worker is gone too."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

pytest.importorskip("ray", reason="the jumpgate[cluster] extra (Ray Serve) is not installed")

from bench.harness.server_process import JumpgateServer, session_pids  # noqa: E402
from tests.e2e.serving.test_serve_tensor_parallel import wait_gone  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(600)]

SCHEMA = {
    "type": "object",
    "properties": {"n": {"type": "integer"}, "ok": {"type": "boolean"}},
    "required": ["n", "ok"],
    "additionalProperties": False,
}


def tp_workers(server: JumpgateServer) -> list[int]:
    """The tensor-parallel workers in the server's session (the replica actor's children, under Ray)."""
    found = []
    for pid in session_pids(server.pid):
        try:
            if b"runtime.parallel.worker" in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except FileNotFoundError:
            pass
    return found


def test_a_ray_replica_split_across_two_ranks_answers_strict(tmp_path, tiny_model_dir):
    args = ["--model", str(tiny_model_dir), "--replicas", "1", "--replica-cpus", "0.5"]
    args += ["--tensor-parallel-size", "2", "--weights", "fp32", "--attention-backend", "torch", "--num-threads", "1"]
    server = JumpgateServer(tmp_path, kv_pool_tokens=512, extra_args=args, startup_timeout_s=420).start()
    try:
        workers = tp_workers(server)
        assert len(workers) == 1, "the replica's rank 0 should have started one worker"
        body = {
            "model": tiny_model_dir.name,
            "messages": [{"role": "user", "content": "Count to one."}],
            "max_tokens": 24,
            "temperature": 0,
            "response_format": {"type": "json_schema", "json_schema": {"name": "n", "strict": True, "schema": SCHEMA}},
        }
        with httpx.Client(base_url=server.url, timeout=180) as http:
            r = http.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        answer = json.loads(r.json()["choices"][0]["message"]["content"])
        assert set(answer) == {"n", "ok"} and isinstance(answer["n"], int) and isinstance(answer["ok"], bool)
    finally:
        server.stop(timeout_s=60)
    assert not wait_gone(workers), "a tensor-parallel worker outlived the server"
