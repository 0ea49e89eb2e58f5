"""The compile worker pool and its compile processes (grammar/service/worker_pool.py,
grammar/service/compile_process.py), with real xgrammar compiles: a compile past its deadline is killed and
the worker answers the next job; one past the memory cap fails clearly and the worker recovers; a
child killed from outside is replaced; a child never outlives its parent."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from grammar import GrammarCompileMemoryError, GrammarCompileTimeout, GrammarSpec
from grammar.errors import GrammarUnserializable
from grammar.service import compile_process
from grammar.service.compile_process import CompileProcess
from grammar.service.worker_pool import CompileWorkerPool
from tests.grammar.service.test_grammar_service import BIG_ENUM, RUNAWAY, pid_alive, required_integers


@pytest.fixture(scope="module")
def tokenizer_json(tokenizer, smollm_dir) -> str:
    from grammar.engines.xgrammar.tokenizer import build_tokenizer_info
    from runtime.model.loader import read_config

    return build_tokenizer_info(tokenizer, read_config(smollm_dir).vocab_size).serialize_json()


@pytest.fixture
def make_pool(tokenizer_json):
    made = []

    def make(memory_limit_bytes: int = 1 << 30) -> CompileWorkerPool:
        pool = CompileWorkerPool(1, lambda: CompileProcess(tokenizer_json, memory_limit_bytes))
        pool.start(wait=True)
        made.append(pool)
        return pool

    yield make
    for pool in made:
        pool.shutdown()
        assert pool.pids() == []


@pytest.fixture
def pool(make_pool):
    return make_pool()


def run(pool: CompileWorkerPool, spec: GrammarSpec, limit_s: float = 30.0):
    """The compiled text, or the error the job ended with."""
    job = pool.submit(lambda compile_fn: compile_fn(spec)[0], time.monotonic() + limit_s)
    try:
        return job.future.result(timeout=limit_s + 30)
    except Exception as e:  # noqa: BLE001 - the test looks at it
        return e


def test_a_job_past_its_deadline_is_killed_and_the_next_job_is_answered(pool):
    [pid] = pool.pids()
    t0 = time.monotonic()
    error = run(pool, RUNAWAY, limit_s=0.5)
    assert isinstance(error, GrammarCompileTimeout), error
    assert time.monotonic() - t0 < 3.0
    assert not pid_alive(pid) and pool.processes_replaced == 1
    assert isinstance(run(pool, GrammarSpec.regex("[a-z]+")), str)
    assert pool.pids() != [pid]


def test_a_job_past_the_memory_cap_fails_clearly_and_the_worker_recovers(make_pool):
    pool = make_pool(64 << 20)
    error = run(pool, BIG_ENUM)
    assert isinstance(error, GrammarCompileMemoryError), error
    assert "memory limit of 0.0625 GiB" in error.message and error.param == "response_format"
    assert isinstance(run(pool, GrammarSpec.regex("[0-9]+")), str)
    assert pool.processes_replaced == 1


def test_a_grammar_that_cannot_be_serialized_is_reported_and_the_worker_recovers(make_pool, monkeypatch):
    """1000 required properties compile in ~0.1 s but serializing needs ~2.4 GB: past the 1 GiB the
    child allows serializing, so it says so (with the compile's seconds) instead of failing. (The
    parent waits for the text as long as the deadline allows here, not only as long as it is worth.)"""
    monkeypatch.setattr(compile_process, "SERIALIZE_WORTH_FLOOR_S", 60.0)
    pool = make_pool(3 << 30)
    t0 = time.monotonic()
    error = run(pool, GrammarSpec.json_schema(required_integers(1000)))
    assert isinstance(error, GrammarUnserializable), error
    assert "serializing the grammar needs more than 1 GiB" in error.why and 0 < error.compile_s < 5
    assert time.monotonic() - t0 < 20
    assert isinstance(run(pool, GrammarSpec.regex("[0-9]+")), str)
    assert pool.processes_replaced == 1


def test_a_text_that_costs_more_than_a_compile_is_not_waited_for(pool):
    """200 required properties compile in well under a second; their text takes several times
    that to write (and to read back): the parent stops waiting once the text costs more than a
    compile here would, and the child, still writing, is replaced."""
    [pid] = pool.pids()
    error = run(pool, GrammarSpec.json_schema(required_integers(400)))
    assert isinstance(error, GrammarUnserializable), error
    assert "costs more than compiling it again" in error.why and 0 < error.compile_s < 5
    assert not pid_alive(pid) and pool.processes_replaced == 1
    assert isinstance(run(pool, GrammarSpec.json_schema(required_integers(3))), str)  # a small text still comes


def test_a_child_killed_from_outside_is_replaced(pool):
    [pid] = pool.pids()
    os.kill(pid, signal.SIGKILL)  # while idle: the next job gets a new child and no error
    time.sleep(0.2)
    assert isinstance(run(pool, GrammarSpec.regex("idle-kill[0-9]")), str)
    [second] = pool.pids()
    assert second != pid

    job = pool.submit(lambda compile_fn: compile_fn(RUNAWAY)[0], time.monotonic() + 60)
    time.sleep(1.0)  # compiling now
    os.kill(second, signal.SIGKILL)  # mid-compile: that job fails clearly, the next one works
    error = _error_of(job)
    assert isinstance(error, GrammarCompileMemoryError) and "died (exit code -9)" in error.message, error
    assert isinstance(run(pool, GrammarSpec.regex("after-kill[0-9]")), str)
    assert pool.processes_replaced == 2


def _error_of(job):
    try:
        job.future.result(timeout=30)
    except Exception as e:  # noqa: BLE001
        return e
    return None


def test_a_child_does_not_outlive_its_parent(tokenizer_json, tmp_path):
    """The parent is SIGKILLed mid-compile (no clean-up runs): its compile child exits by itself."""
    info = tmp_path / "tokenizer.json"
    info.write_text(tokenizer_json)
    script = tmp_path / "parent.py"
    script.write_text(
        textwrap.dedent(f"""
        import sys, threading, time
        from grammar.service.compile_process import CompileProcess
        from tests.grammar.service.test_grammar_service import RUNAWAY

        if __name__ == "__main__":
            process = CompileProcess(open({str(info)!r}).read(), None)
            process.wait_ready()
            threading.Thread(target=process.compile, args=(RUNAWAY, lambda: time.monotonic() + 600),
                             daemon=True).start()
            print(process.pid, flush=True)
            time.sleep(600)
    """)
    )
    root = Path(__file__).resolve().parents[3]
    parent = subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    try:
        child = int(parent.stdout.readline())
        time.sleep(0.5)
        assert pid_alive(child)
    finally:
        parent.kill()
        parent.wait(30)
    deadline = time.monotonic() + 10
    while pid_alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pid_alive(child)


class _SlowToStart:
    """A compile process whose start takes `seconds` (a loaded machine; a child that never comes)."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self.replaced, self.pid = seconds, 0, None

    def wait_ready(self) -> None:
        time.sleep(self.seconds)

    def kill(self) -> None:
        pass


def test_waiting_for_the_children_at_start_up_is_bounded():
    """A server waits for its compile processes before it listens (gateway/startup.py), but never
    past `timeout_s`: a child slow to start goes on starting in the background."""
    pool = CompileWorkerPool(1, lambda: _SlowToStart(3.0))
    t0 = time.monotonic()
    pool.start(wait=True, timeout_s=0.3)
    assert 0.25 <= time.monotonic() - t0 < 2.0
    quick = CompileWorkerPool(1, lambda: _SlowToStart(0.2))
    t0 = time.monotonic()
    quick.start(wait=True, timeout_s=10.0)
    assert 0.15 <= time.monotonic() - t0 < 5.0  # returns once the child is ready, not at the bound
    for p in (pool, quick):
        p.shutdown(timeout_s=5.0)
