"""Reliability of the engine itself (tiny random Llama, fast): under a mix of completions, aborts,
early exits, failing grammars, evictions and retractions, every request ends, and once idle the
slot accounting is back at its baseline (no slot, row or queue entry is ever leaked).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time

import pytest
import torch

from runtime.api import EngineError, GenerateRequest, StreamEvent
from runtime.decode.sampling import SamplingParams
from runtime.engine.engine import Engine

TIMEOUT_S = 120  # no scenario here may take longer; a hang fails instead of blocking the suite


# --------------------------------------------------------------------------- helpers


class FlakyMatcher:
    """A TokenMatcher that allows every token and raises in one chosen method."""

    def __init__(self, fail_in: str, after: int):
        self.fail_in = fail_in
        self.after = after
        self.calls: dict[str, int] = {}

    def _tick(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1
        if name == self.fail_in and self.calls[name] > self.after:
            raise RuntimeError(f"matcher broke in {name}")

    def fill_bitmask(self, bitmask, row: int) -> None:
        self._tick("fill_bitmask")  # leaves the row as it is: all tokens allowed

    def accept(self, token_id: int) -> bool:
        self._tick("accept")
        return True

    def rollback(self, num_tokens: int) -> None:
        self._tick("rollback")

    def is_terminated(self) -> bool:
        self._tick("is_terminated")
        return False

    def is_completed(self) -> bool:
        return False

    def jump_forward_tokens(self, learn: bool = True) -> list[int]:
        self._tick("jump_forward_tokens")
        return []

    def valid_prefix(self, token_ids: list[int]) -> int:
        self._tick("valid_prefix")
        return len(token_ids)

    withholds_output = False

    def output_verdict(self, room: int | None = None) -> int | None:
        self._tick("output_verdict")
        return None


class FlakyConstraint:
    """A CompiledConstraint whose matchers raise (or whose new_matcher itself raises)."""

    def __init__(self, fail_in: str, after: int = 2):
        self.fail_in = fail_in
        self.after = after

    def new_matcher(self) -> FlakyMatcher:
        if self.fail_in == "new_matcher":
            raise RuntimeError("matcher could not be built")
        return FlakyMatcher(self.fail_in, self.after)


def greedy(max_new_tokens: int) -> SamplingParams:
    return SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, ignore_eos=True)


def random_ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(100, 40000) for _ in range(n)]


async def consume(
    engine: Engine, spec: GenerateRequest, *, leave_after: int | None = None, abort_after: int | None = None
) -> list[StreamEvent]:
    """Stream one request. leave_after: stop listening after N events (closing the iteration early);
    abort_after: call Engine.abort after N events and keep listening until the end."""
    events: list[StreamEvent] = []
    async with contextlib.aclosing(engine.submit(spec)) as stream:
        async for ev in stream:
            events.append(ev)
            if leave_after is not None and len(events) >= leave_after:
                break
            if abort_after is not None and len(events) == abort_after:
                engine.abort(spec.rid)
    return events


def wait_idle(engine: Engine, timeout_s: float = 20.0) -> dict:
    """Poll (on the engine thread) until nothing runs or waits; return the final stats."""
    deadline = time.monotonic() + timeout_s
    while True:
        stats = engine.stats()
        idle = stats.running_requests == 0 and stats.waiting_requests == 0
        if idle or time.monotonic() > deadline:
            return stats
        time.sleep(0.05)


def assert_baseline(engine: Engine) -> dict:
    stats = wait_idle(engine)
    assert stats.running_requests == 0, stats
    assert stats.waiting_requests == 0, stats
    assert stats.kv_slots_request_only == 0, stats
    assert stats.kv_slots_free + stats.kv_slots_tree == stats.kv_slots_total, stats
    engine.call(engine.check_invariant).result(timeout=30)
    # every request-table row is back (a leaked row would shrink the batch for good)
    rows_free = engine.call(lambda: engine.runner.req_table.num_free_rows).result(timeout=30)
    assert rows_free == engine.config.max_running_requests
    return stats


@pytest.fixture
def engine_factory(tiny_model_dir):
    made: list[Engine] = []

    def make(**cfg) -> Engine:
        cfg.setdefault("debug_invariants", True)  # the invariant is checked after every step too
        engine = Engine(model=str(tiny_model_dir), **cfg)
        made.append(engine)
        return engine

    yield make
    for engine in made:
        engine.shutdown()


# --------------------------------------------------------------------------- the mixed workload


def test_mixed_completions_aborts_errors_and_evictions_return_to_baseline(engine_factory):
    # ~3 prompts fit at once: admissions wait, finished prefixes are evicted to make room
    engine = engine_factory(kv_pool_tokens=2048, chunked_prefill_tokens=256)
    rng = random.Random(7)
    shared = random_ids(rng, 300)

    def prompt(n: int, share: bool) -> list[int]:
        return (shared if share else []) + random_ids(rng, n)

    async def scenario():
        jobs = []
        # plain completions, half of them sharing a prefix
        for i in range(6):
            jobs.append(("complete", consume(engine, GenerateRequest(prompt(200 + 40 * i, i % 2 == 0), greedy(24)))))
        # the client stops listening after a couple of events (closing the stream aborts)
        for i in range(3):
            jobs.append(("left", consume(engine, GenerateRequest(prompt(250, i == 0), greedy(200)), leave_after=2)))
        # Engine.abort while streaming
        for _ in range(2):
            jobs.append(("aborted", consume(engine, GenerateRequest(prompt(150, True), greedy(200)), abort_after=1)))
        # grammars that break in each way a matcher can, next to a healthy neighbour
        for fail_in in ("new_matcher", "fill_bitmask", "accept", "jump_forward_tokens", "is_terminated"):
            spec = GenerateRequest(prompt(120, False), greedy(24), constraint=FlakyConstraint(fail_in))
            jobs.append((f"broken:{fail_in}", consume(engine, spec)))
        results = await asyncio.wait_for(asyncio.gather(*(job for _, job in jobs)), timeout=TIMEOUT_S)
        return [(kind, events) for (kind, _), events in zip(jobs, results)]

    engine.start()
    results = asyncio.run(scenario())

    for kind, events in results:
        last = events[-1]
        if kind == "complete":
            assert last.finished and last.finish_reason == "length" and last.completion_tokens == 24, last
            assert sum(len(e.token_ids) for e in events) == 24
        elif kind == "left":
            assert len(events) == 2
        elif kind == "aborted":
            assert last.finished and last.finish_reason == "abort", last
        else:
            assert last.finished and last.finish_reason == "error", (kind, last)
            assert "matcher" in (last.error or ""), last

    stats = assert_baseline(engine)
    assert stats.evicted_tokens > 0, stats  # the pool was under pressure

    # and the engine keeps serving afterwards
    again = engine.generate_many([GenerateRequest(prompt(100, True), greedy(8)) for _ in range(3)], timeout=TIMEOUT_S)
    assert [r.finish_reason for r in again] == ["length"] * 3
    assert_baseline(engine)


@pytest.mark.parametrize("fail_in", ["new_matcher", "fill_bitmask", "accept"])
def test_a_failing_grammar_fails_only_its_own_request(engine_factory, fail_in):
    """Before the fix, a matcher raising inside a step failed every request in flight and leaked the
    slots of that pass; a raising new_matcher killed the engine thread (its caller hung)."""
    engine = engine_factory(kv_pool_tokens=4096)
    rng = random.Random(1)

    async def scenario():
        healthy = [consume(engine, GenerateRequest(random_ids(rng, 200), greedy(16))) for _ in range(3)]
        broken = consume(engine, GenerateRequest(random_ids(rng, 60), greedy(16), constraint=FlakyConstraint(fail_in)))
        return await asyncio.wait_for(asyncio.gather(broken, *healthy), timeout=TIMEOUT_S)

    engine.start()
    broken, *healthy = asyncio.run(scenario())
    assert broken[-1].finish_reason == "error" and "matcher" in broken[-1].error
    assert [h[-1].finish_reason for h in healthy] == ["length"] * 3
    assert all(h[-1].completion_tokens == 16 for h in healthy)
    assert engine.is_running
    assert_baseline(engine)


def test_a_failing_step_fails_what_is_in_flight_and_leaks_nothing(engine_factory, monkeypatch):
    """A forward pass that raises (device error, bug) errors the requests of that step; their slots
    (including the ones given to the failed pass) go back, and the next requests are served."""
    engine = engine_factory(kv_pool_tokens=4096)
    rng = random.Random(2)
    real_forward = engine.runner.model.forward
    calls = {"n": 0}

    def flaky_forward(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("simulated device error")
        return real_forward(*args, **kwargs)

    monkeypatch.setattr(engine.runner.model, "forward", flaky_forward)
    engine.start()

    async def scenario():
        jobs = [consume(engine, GenerateRequest(random_ids(rng, 300), greedy(20))) for _ in range(3)]
        return await asyncio.wait_for(asyncio.gather(*jobs), timeout=TIMEOUT_S)

    results = asyncio.run(scenario())
    reasons = [events[-1].finish_reason for events in results]
    assert "error" in reasons and set(reasons) <= {"error", "length"}, reasons
    assert_baseline(engine)
    out = engine.generate_many([GenerateRequest(random_ids(rng, 100), greedy(8))], timeout=TIMEOUT_S)
    assert out[0].finish_reason == "length"
    assert_baseline(engine)


# --------------------------------------------------------------------------- a pool far smaller than the work


def test_pool_far_smaller_than_the_working_set_queues_evicts_retracts_and_completes(engine_factory):
    """16 concurrent ~1.5k-token prompts on a 2048-slot pool: at most one prompt fits whole, so
    requests queue, cached prefixes are evicted and running requests are retracted; all complete."""
    engine = engine_factory(kv_pool_tokens=2048, num_threads=1)
    rng = random.Random(1)
    groups = [random_ids(rng, 1100) for _ in range(4)]  # four shared 1.1k-token prefixes
    specs = []
    for i in range(16):
        n = rng.randrange(1300, 1600)
        specs.append(GenerateRequest(groups[i % 4] + random_ids(rng, n - 1100), greedy(rng.randrange(16, 96))))
    working_set = sum(len(s.prompt_ids) + s.sampling.max_new_tokens for s in specs)
    assert working_set > 10 * engine.kv_pool_tokens

    async def scenario():
        # every request is queued before the engine thread starts: the schedule is deterministic
        streams = [consume(engine, spec) for spec in specs]
        tasks = [asyncio.ensure_future(s) for s in streams]
        await asyncio.sleep(0)  # let each task submit
        engine.start()
        return await asyncio.wait_for(asyncio.gather(*tasks), timeout=TIMEOUT_S)

    started = time.monotonic()
    results = asyncio.run(scenario())
    elapsed = time.monotonic() - started

    for spec, events in zip(specs, results):
        last = events[-1]
        assert last.finished and last.finish_reason == "length", last
        assert last.completion_tokens == spec.sampling.max_new_tokens
        assert sum(len(e.token_ids) for e in events) == spec.sampling.max_new_tokens
    stats = assert_baseline(engine)
    assert stats.evicted_tokens > 0, stats
    assert stats.retractions > 0, stats
    assert elapsed < TIMEOUT_S


# --------------------------------------------------------------------------- queue bound and aborts


def test_waiting_queue_is_bounded_and_refuses_at_once(engine_factory):
    """At most max_running + max_waiting requests are in the engine: a burst that fits is accepted
    whole (even before the loop admitted any of it), the next one is refused at once, and while the
    rows are taken no more than max_waiting requests wait."""
    engine = engine_factory(kv_pool_tokens=4096, max_running_requests=2, max_waiting_requests=2)
    rng = random.Random(3)
    waiting_seen: list[int] = []

    async def scenario():
        burst = [
            asyncio.ensure_future(consume(engine, GenerateRequest(random_ids(rng, 50), greedy(32)))) for _ in range(4)
        ]
        await asyncio.sleep(0)  # all four submitted before the engine thread runs
        t0 = time.monotonic()
        with pytest.raises(EngineError) as refused:
            engine.submit(GenerateRequest(random_ids(rng, 50), greedy(8)))
        assert time.monotonic() - t0 < 0.5
        assert refused.value.code == "overloaded"
        engine.start()
        while not all(t.done() for t in burst):
            stats = engine.stats()
            if stats.running_requests == 2:  # both rows taken: the rest waits, and no more than that
                waiting_seen.append(stats.waiting_requests)
            await asyncio.sleep(0.005)
        done = await asyncio.wait_for(asyncio.gather(*burst), timeout=TIMEOUT_S)
        # room again once the burst is through
        more = await asyncio.wait_for(consume(engine, GenerateRequest(random_ids(rng, 50), greedy(4))), TIMEOUT_S)
        return done, more

    done, more = asyncio.run(scenario())
    assert [d[-1].finish_reason for d in done] == ["length"] * 4 and more[-1].finish_reason == "length"
    assert waiting_seen and max(waiting_seen) <= 2, waiting_seen
    assert_baseline(engine)


def test_a_burst_on_an_idle_engine_is_not_refused(engine_factory):
    """Before the fix the bound counted requests not yet admitted, so a burst of
    max_waiting + 1 requests on an idle engine got a spurious refusal although rows were free."""
    engine = engine_factory(kv_pool_tokens=4096, max_running_requests=4, max_waiting_requests=1).start()
    rng = random.Random(5)

    async def scenario():
        jobs = [consume(engine, GenerateRequest(random_ids(rng, 40), greedy(4))) for _ in range(5)]
        return await asyncio.wait_for(asyncio.gather(*jobs), timeout=TIMEOUT_S)

    results = asyncio.run(scenario())
    assert [r[-1].finish_reason for r in results] == ["length"] * 5
    assert_baseline(engine)


def test_aborts_of_waiting_unknown_and_finished_requests_are_harmless(engine_factory):
    engine = engine_factory(kv_pool_tokens=2048, max_running_requests=1)
    rng = random.Random(4)

    async def scenario():
        first = asyncio.ensure_future(consume(engine, GenerateRequest(random_ids(rng, 100), greedy(64))))
        waiting_spec = GenerateRequest(random_ids(rng, 100), greedy(64))
        waiting = asyncio.ensure_future(consume(engine, waiting_spec))
        await asyncio.sleep(0)
        engine.start()
        engine.abort(waiting_spec.rid)  # most likely still queued behind the only running row
        engine.abort(waiting_spec.rid)  # twice
        engine.abort("no-such-request")
        return await asyncio.wait_for(asyncio.gather(first, waiting), timeout=TIMEOUT_S)

    first, waiting = asyncio.run(scenario())
    assert first[-1].finish_reason == "length"
    assert waiting[-1].finish_reason == "abort" and waiting[-1].completion_tokens < 64
    engine.abort(first[-1].rid)  # already finished
    assert_baseline(engine)


def test_default_pool_size_on_cuda_comes_from_free_device_memory(monkeypatch):
    """Not from host memory: on a GPU the pool takes most of what the weights left free."""
    from runtime.model import runner as engine_module

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (40 << 30, 141 << 30))
    bpt = 23040  # SmolLM2-135M in bf16: 30 layers x 3 KV heads x 64 x 2 (K, V) x 2 bytes
    tokens = engine_module.default_pool_tokens(bpt, torch.device("cuda"))
    assert tokens == int(((40 << 30) * engine_module.CUDA_KV_FRACTION - engine_module.CUDA_RESERVE_BYTES) // bpt)
    assert tokens > 1_000_000
    assert 4096 <= engine_module.default_pool_tokens(bpt, torch.device("cpu")) <= 65536
