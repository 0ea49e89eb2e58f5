"""The one OS thread that loads the model and runs every pass (the engine thread).

torch's CPU kernels run their intra-op work on an OpenMP thread team, and OpenMP keeps one team
per calling thread. When the model was loaded (and its weights packed) on the caller's thread
and run on another, two teams existed; libgomp then counts more threads than cores and throttles
its workers' spin-waiting, so every parallel region woke its worker slowly. On the dev box a
batch-1 q4 pass took 13.7 ms that way against 7.2 ms with loading and running on one thread
(/tmp microbenchmark, 2 threads). So the engine loads on this thread and its loop runs here too.
"""

from __future__ import annotations

import concurrent.futures
import queue
import threading
from typing import Any, Callable


class TorchThread:
    """A daemon thread running submitted callables in order (a daemon, so a process that never
    shuts its engine down still exits)."""

    def __init__(self, name: str):
        self._tasks: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def submit(self, fn: Callable[[], Any]) -> concurrent.futures.Future:
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self._tasks.put((fn, fut))
        return fut

    def run(self, fn: Callable[[], Any]) -> Any:
        """`fn()` on this thread, waited for; its exception is raised here."""
        return self.submit(fn).result()

    def close(self) -> None:
        """Stop after the tasks already submitted."""
        self._tasks.put(None)

    def _run(self) -> None:
        while True:
            task = self._tasks.get()
            if task is None:
                return
            fn, fut = task
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn())
            except BaseException as e:  # delivered to the submitter
                fut.set_exception(e)
            del task, fn, fut  # hold nothing (an engine, its model) while waiting for the next task
