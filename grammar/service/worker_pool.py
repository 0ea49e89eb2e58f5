"""A small pool of compile workers: each one a thread driving its own compile process.

A job runs on a worker thread (so neither the HTTP event loop nor other requests wait for it) and
may hand xgrammar compiles to the worker's child process (grammar/service/compile_process.py), which is
killed when the job's deadline passes. A worker is therefore never stuck past a deadline: the
thread is free again at once and its child is replaced.

A worker starts its child on its first compile, or at once after `start()`. The time a job waits
for a child to start is not the grammar's: it moves the job's deadline later (`pause()`), and
waiters add it to theirs.
`shutdown` kills running compiles and stops the children.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from grammar.errors import GrammarCompileTimeout, GrammarServiceBusy, GrammarUnserializable
from grammar.service.compile_process import CompileProcess, warm_up

# A job is called with the worker's compile function: spec -> (serialize_json() text, seconds
# spent waiting for the compile process to start), under the job's deadline. It raises
# GrammarUnserializable (with those seconds as `waited_s`) for a spec that compiled but whose
# grammar the process could not send back.
CompileFn = Callable[[Any], tuple[str, float]]


@dataclass(eq=False)
class CompileJob:
    fn: Callable[[CompileFn], Any]
    deadline: float  # monotonic; extended when more waiters join
    future: Future = field(default_factory=Future)
    # time spent waiting for a compile process to start (so far, and since when if now): added to
    # every deadline
    paused_s: float = 0.0
    paused_since: float | None = None

    def extend_deadline(self, deadline: float) -> None:
        self.deadline = max(self.deadline, deadline)

    def pause(self) -> float:
        since = self.paused_since
        return self.paused_s + (time.monotonic() - since if since is not None else 0.0)

    def remaining_s(self, deadline: float) -> float:
        """Seconds a waiter whose own deadline is `deadline` still waits."""
        return deadline + self.pause() - time.monotonic()


class CompileWorkerPool:
    def __init__(
        self, workers: int, make_process: Callable[[], CompileProcess], *, name: str = "grammar-compile"
    ) -> None:
        if workers < 1:
            raise ValueError("workers must be >= 1")
        self._size = workers
        self._make_process = make_process
        self._name = name
        self._queue: queue.SimpleQueue[CompileJob | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._processes: list[CompileProcess] = []
        self._ready: list[threading.Event] = []  # set once a worker took its first job or started its child
        self._closed = False

    @property
    def processes_replaced(self) -> int:
        """Children killed (time or memory limit) or found dead, and started again."""
        with self._lock:
            return sum(p.replaced for p in self._processes)

    def pids(self) -> list[int]:
        """The compile children running now."""
        with self._lock:
            return [pid for pid in (p.pid for p in self._processes) if pid is not None]

    def start(self, processes: bool = True, wait: bool = False, timeout_s: float | None = None) -> None:
        """Start the workers, and with `processes` their children now rather than on their first
        compile; with `wait`, return once every child is ready or `timeout_s` has passed (else at
        once; children not ready by then go on starting in the background)."""
        with self._lock:
            if not self._threads and not self._closed:
                warm_up()
                for _ in range(self._size):
                    process = self._make_process()
                    ready = threading.Event()
                    thread = threading.Thread(
                        target=self._run, args=(process, processes, ready), name=self._name, daemon=True
                    )
                    self._processes.append(process)
                    self._threads.append(thread)
                    self._ready.append(ready)
                    thread.start()
            ready_events = list(self._ready)
        if wait:
            end = None if timeout_s is None else time.monotonic() + timeout_s
            for ready in ready_events:
                ready.wait(None if end is None else max(0.0, end - time.monotonic()))

    def submit(self, fn: Callable[[CompileFn], Any], deadline: float) -> CompileJob:
        with self._lock:
            if self._closed:
                raise GrammarServiceBusy("grammar compile pool is shut down")
        self.start(processes=False)
        job = CompileJob(fn, deadline)
        self._queue.put(job)
        return job

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Kill running compiles, stop the workers and their children (waits up to `timeout_s`)."""
        with self._lock:
            self._closed = True
            threads = list(self._threads)
        for _ in threads:
            self._queue.put(None)
        end = time.monotonic() + timeout_s
        for thread in threads:
            thread.join(max(0.0, end - time.monotonic()))

    def _run(self, process: CompileProcess, start_process: bool, ready: threading.Event) -> None:
        try:
            if start_process:
                try:
                    process.wait_ready()
                except Exception:  # noqa: BLE001 - logged; the next compile tries again and says why
                    pass
            ready.set()
            while True:
                job = self._queue.get()
                if job is None:
                    return
                self._run_job(job, process)
        finally:
            process.kill()

    def _run_job(self, job: CompileJob, process: CompileProcess) -> None:
        if time.monotonic() > job.deadline:
            # every waiter has given up already: don't spend a compile on it
            job.future.set_exception(GrammarCompileTimeout("grammar compile timed out while queued; retry later"))
            return
        if not job.future.set_running_or_notify_cancel():
            return

        def deadline() -> float:
            return 0.0 if self._closed else job.deadline + job.pause()  # shutting down: kill it now

        def compile_fn(spec: Any) -> tuple[str, float]:
            job.paused_since = started = time.monotonic()
            try:
                process.wait_ready()
            finally:
                job.paused_s, job.paused_since = job.pause(), None
            waited = time.monotonic() - started
            try:
                return process.compile(spec, deadline), waited
            except GrammarUnserializable as e:
                e.waited_s = waited
                raise

        try:
            job.future.set_result(job.fn(compile_fn))
        except BaseException as e:  # noqa: BLE001 - delivered to the waiters
            job.future.set_exception(e)
