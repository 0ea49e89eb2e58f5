"""Helpers shared by the benchmarks: JSON-line output and timed engine runs."""

from __future__ import annotations

import json
import sys
import threading
import time
from dataclasses import dataclass, field

from runtime.api import GenerateRequest, StreamEvent


def emit(record: dict) -> None:
    print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in record.items()}), flush=True)
    sys.stdout.flush()


@dataclass
class Timeline:
    submitted: float
    first_token: float | None = None
    finished: float | None = None
    events: list[StreamEvent] = field(default_factory=list)

    @property
    def ttft(self) -> float:
        return (self.first_token or self.finished) - self.submitted

    @property
    def last(self) -> StreamEvent:
        return self.events[-1]

    @property
    def text(self) -> str:
        return "".join(e.text for e in self.events)


def run_timed(engine, specs: list[GenerateRequest], timeout: float = 1800) -> list[Timeline]:
    """Submit all specs at once and record when each got its first token and finished."""
    engine.start()
    done = threading.Semaphore(0)
    lines: dict[str, Timeline] = {}

    def make_emit(rid):
        def on_event(ev: StreamEvent) -> None:
            tl = lines[rid]
            now = time.perf_counter()
            tl.events.append(ev)
            if tl.first_token is None and ev.token_ids:
                tl.first_token = now
            if ev.finished:
                tl.finished = now
                done.release()
        return on_event

    for s in specs:
        lines[s.rid] = Timeline(submitted=time.perf_counter())
        engine.enqueue(s, make_emit(s.rid))
    for _ in specs:
        if not done.acquire(timeout=timeout):
            raise TimeoutError("benchmark run timed out")
    return [lines[s.rid] for s in specs]
