"""Helpers shared by the benchmarks: JSON-line output, the commit measured, the default tokenizer,
timed mask walks and timed engine runs."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from runtime.api import GenerateRequest, StreamEvent


def git_commit(checkout: str | Path = ".") -> str:
    """The short commit a checkout is at ("" outside git), so records say which code they measured."""
    run = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return run.stdout.strip() if run.returncode == 0 else ""


def emit(record: dict, file=None) -> None:
    """One JSON line (floats to 4 places) on stdout, or on `file`, flushed at once."""
    out = sys.stdout if file is None else file
    print(
        json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in record.items()}), file=out, flush=True
    )


def default_tokenizer():
    """The default model's tokenizer and its vocabulary size (config.json's: the logits' width)."""
    from runtime.model.loader import load_tokenizer, read_config, resolve_model_dir

    model_dir = resolve_model_dir()
    return load_tokenizer(model_dir), read_config(model_dir).vocab_size


def mask_walk_us(new_matcher, tokens: list[int], words: int, reps: int, timed_accept: bool = False) -> float | None:
    """Median µs per token to fill the mask into an int32 [1, words] row along `tokens`
    (`timed_accept`: and to accept the token), each repetition on a fresh `new_matcher()` after one
    untimed warm-up pass (it warms lazy caches); None if the matcher refuses a token."""
    import torch

    bitmask = torch.zeros((1, words), dtype=torch.int32)
    per_rep = []
    for rep in range(reps + 1):
        matcher = new_matcher()
        spent = 0.0
        for token_id in tokens:
            started = time.perf_counter()
            matcher.fill_bitmask(bitmask, 0)
            filled = time.perf_counter()
            ok = matcher.accept(token_id)
            spent += (time.perf_counter() if timed_accept else filled) - started
            if not ok:
                return None
        if rep:
            per_rep.append(spent / len(tokens) * 1e6)
    return statistics.median(per_rep)


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
