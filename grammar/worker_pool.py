"""A small pool of daemon threads for compiles that may overrun their time limit.

xgrammar compiles in C++ (releasing the GIL) and cannot be interrupted. A compile that overruns
its limit is *abandoned*: its thread finishes the job in the background (the result still lands
in the cache) and then exits, while a replacement thread takes its place so later requests never
queue behind it. Replacements are capped (`max_abandoned`): past that, a runaway schema costs
capacity instead of unbounded threads, and with no capacity left `submit` refuses at once.

Threads are daemons, so a runaway compile never keeps the process from exiting.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from grammar.errors import GrammarCompileTimeout, GrammarServiceBusy


@dataclass(eq=False)
class CompileJob:
    fn: Callable[[], Any]
    deadline: float  # monotonic; extended when more waiters join
    future: Future = field(default_factory=Future)
    worker: "_Worker | None" = None

    def extend_deadline(self, deadline: float) -> None:
        self.deadline = max(self.deadline, deadline)


@dataclass(eq=False)
class _Worker:
    thread: threading.Thread | None = None
    retired: bool = False  # abandoned: exit after the current job


class CompileWorkerPool:
    def __init__(self, workers: int, *, max_abandoned: int = 4, name: str = "grammar-compile") -> None:
        if workers < 1:
            raise ValueError("workers must be >= 1")
        self._queue: queue.SimpleQueue[CompileJob | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._name = name
        self._live: set[_Worker] = set()  # not retired
        self._abandoned_running = 0
        self.max_abandoned = max_abandoned
        self._closed = False
        for _ in range(workers):
            self._spawn()

    @property
    def abandoned_running(self) -> int:
        with self._lock:
            return self._abandoned_running

    @property
    def live_workers(self) -> int:
        with self._lock:
            return len(self._live)

    def submit(self, fn: Callable[[], Any], deadline: float) -> CompileJob:
        with self._lock:
            if self._closed:
                raise GrammarServiceBusy("grammar compile pool is shut down")
            if not self._live:
                raise GrammarServiceBusy(
                    f"all grammar compile workers are stuck on runaway compiles "
                    f"({self._abandoned_running} running past their limit); retry later"
                )
        job = CompileJob(fn, deadline)
        self._queue.put(job)
        return job

    def abandon(self, job: CompileJob) -> None:
        """The waiter gave up on a job that is running: retire its thread, replace it (capped)."""
        with self._lock:
            worker = job.worker
            if worker is None or worker.retired or job.future.done():
                return
            worker.retired = True
            self._live.discard(worker)
            self._abandoned_running += 1
            replace = self._abandoned_running <= self.max_abandoned and not self._closed
        if replace:
            self._spawn()

    def shutdown(self) -> None:
        """Stop idle workers; running compiles finish in the background (daemon threads)."""
        with self._lock:
            self._closed = True
            count = len(self._live)
        for _ in range(count):
            self._queue.put(None)

    def _spawn(self) -> None:
        worker = _Worker()
        worker.thread = threading.Thread(target=self._run, args=(worker,), name=self._name, daemon=True)
        with self._lock:
            self._live.add(worker)
        worker.thread.start()

    def _run(self, worker: _Worker) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                with self._lock:
                    self._live.discard(worker)
                return
            with self._lock:
                job.worker = worker
            if time.monotonic() > job.deadline:
                # every waiter has given up already: don't spend a compile on it
                job.future.set_exception(GrammarCompileTimeout("grammar compile timed out while queued; retry later"))
            elif job.future.set_running_or_notify_cancel():
                try:
                    job.future.set_result(job.fn())
                except BaseException as e:  # noqa: BLE001 - delivered to the waiters
                    job.future.set_exception(e)
            with self._lock:
                job.worker = None
                if worker.retired:
                    self._abandoned_running -= 1
                    return
