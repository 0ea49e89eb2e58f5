"""GrammarService: memory LRU, disk cache across restarts, corrupt files, time limit, single flight."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time

import pytest

import grammar.service as service_module
from grammar.cache import MemoryLRU
from grammar import (
    CompiledGrammarHandle,
    GrammarCompileTimeout,
    GrammarService,
    GrammarServiceBusy,
    GrammarSpec,
    GrammarSpecError,
)

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}


@pytest.fixture(scope="module")
def vocab_size(smollm_dir):
    from runtime.loader import read_config

    return read_config(smollm_dir).vocab_size


@pytest.fixture
def make_service(tokenizer, vocab_size):
    made = []

    def make(**kw):
        svc = GrammarService(tokenizer, vocab_size, **kw)
        made.append(svc)
        return svc

    yield make
    for svc in made:
        svc.close()


def accepts(handle: CompiledGrammarHandle, tokenizer, text: str) -> bool:
    matcher = handle.new_matcher()
    return all(matcher.accept(t) for t in tokenizer.encode(text, add_special_tokens=False)) and matcher.is_completed()


def test_memory_hit_returns_the_same_handle(make_service):
    svc = make_service()
    a = svc.compile(GrammarSpec.json_schema(SCHEMA))
    b = svc.compile(GrammarSpec.json_schema(json.loads(json.dumps(SCHEMA))))
    assert a is b
    stats = svc.stats()
    assert (stats.misses, stats.memory_hits, stats.disk_hits) == (1, 1, 0)
    assert stats.compile_seconds_total > 0 and stats.memory_entries == 1


def test_stop_token_is_im_end(make_service, tokenizer):
    svc = make_service()
    assert svc.stop_token_ids == [tokenizer.convert_tokens_to_ids("<|im_end|>")] == [2]


def test_disk_cache_survives_a_restart(make_service, tmp_path, tokenizer):
    first = make_service(cache_dir=tmp_path)
    spec = GrammarSpec.json_schema(SCHEMA)
    first.compile(spec)
    files = list(tmp_path.glob("*.json"))
    assert [f.name for f in files] == [f"{first.key(spec)}.json"]
    assert not list(tmp_path.glob(".*"))  # no temp file left behind

    second = make_service(cache_dir=tmp_path)  # "restart": a new service on the same folder
    handle = second.compile(spec)
    stats = second.stats()
    assert (stats.disk_hits, stats.misses) == (1, 0)
    assert accepts(handle, tokenizer, '{"name":"Ada"}')

    third = make_service(cache_dir=tmp_path)
    assert third.warm_from_disk() == 1
    third.compile(spec)
    assert third.stats().memory_hits == 1 and third.stats().disk_hits == 0


@pytest.mark.parametrize("damage", ["garbage", "truncated", "version"])
def test_a_corrupt_cache_file_is_discarded_and_recompiled(damage, make_service, tmp_path, tokenizer, caplog):
    spec = GrammarSpec.json_schema(SCHEMA)
    make_service(cache_dir=tmp_path).compile(spec)
    path = next(tmp_path.glob("*.json"))
    text = path.read_text()
    if damage == "garbage":
        path.write_bytes(b"\x00\xffnot json")
    elif damage == "truncated":
        path.write_text(text[: len(text) // 2])
    else:
        data = json.loads(text)
        data["__VERSION__"] = "v0"
        path.write_text(json.dumps(data))

    svc = make_service(cache_dir=tmp_path)
    with caplog.at_level(logging.WARNING, logger="jumpgate.grammar.cache"):
        handle = svc.compile(spec)
    assert "discarding" in caplog.text
    stats = svc.stats()
    assert (stats.disk_hits, stats.misses) == (0, 1)
    assert accepts(handle, tokenizer, '{"name":"Ada"}')
    assert path.read_text() == text  # rewritten with a good copy


def test_stale_temp_files_in_the_disk_cache_are_removed_at_start(make_service, tmp_path):
    stale, fresh = tmp_path / ".0123456789abcdef.killed.tmp", tmp_path / ".0123456789abcdef.live.tmp"
    for f in (stale, fresh):
        f.write_text("{")
    old = time.time() - 3600
    os.utime(stale, (old, old))
    make_service(cache_dir=tmp_path)
    assert not stale.exists() and fresh.exists()


def test_memory_lru_is_bounded(make_service):
    svc = make_service(max_memory_entries=2)
    specs = [GrammarSpec.regex(p) for p in ("a+", "b+", "c+")]
    for spec in specs:
        svc.compile(spec)
    assert svc.stats().memory_entries == 2
    assert svc.get_cached(specs[0]) is None and svc.get_cached(specs[2]) is not None
    svc.compile(specs[0])  # evicted: compiled again (no disk cache)
    assert svc.stats().misses == 4


def test_memory_lru_is_bounded_in_bytes(make_service):
    """A big enum compiles to megabytes of token masks: the byte budget, not the entry count,
    decides what stays; the newest grammar stays even when it alone is over the budget."""
    big = GrammarSpec.json_schema({"enum": [f"value-{i}" for i in range(3000)]})
    small = [GrammarSpec.regex(p) for p in ("a+", "b+")]
    probe = make_service()
    size_big = probe.compile(big).memory_size_bytes
    size_small = probe.compile(small[0]).memory_size_bytes
    assert size_big > 10 * size_small
    svc = make_service(max_memory_entries=100, max_memory_bytes=size_big + 3 * size_small)
    svc.compile(big)
    svc.compile(small[0])
    svc.compile(small[1])
    assert svc.stats().memory_entries == 3
    assert svc.stats().memory_bytes <= size_big + 3 * size_small
    huge = GrammarSpec.json_schema({"enum": [f"other-{i}" for i in range(6000)]})
    svc.compile(huge)  # over the whole budget alone: everything older goes, it stays
    assert svc.get_cached(huge) is not None
    assert all(svc.get_cached(spec) is None for spec in [big, *small])
    assert svc.stats().memory_entries == 1


def test_memory_lru_unit_accounting():
    lru = MemoryLRU(max_entries=10, max_bytes=10, size_of=len)
    lru.put("a", "xxxx")
    lru.put("b", "yyyy")
    lru.put("a", "zz")  # replaced: its old size leaves the count
    assert lru.total_bytes == 6 and lru.keys() == ["b", "a"]
    lru.put("c", "wwwww")  # 11 > 10: the least recently used goes
    assert lru.keys() == ["a", "c"] and lru.total_bytes == 7
    with pytest.raises(ValueError):
        MemoryLRU(max_entries=1, max_bytes=5)  # a byte budget needs a size function


def test_refusals_are_counted_and_raised_with_param(make_service):
    svc = make_service()
    with pytest.raises(GrammarSpecError) as e:
        svc.compile(GrammarSpec.regex("(?<=a)b"))
    assert e.value.param == "regex"
    with pytest.raises(GrammarSpecError, match="EBNF grammar cannot be compiled"):
        svc.compile(GrammarSpec.ebnf("root ::= undefined_rule"))
    assert svc.stats().compile_errors == 2
    assert svc.stats().memory_entries == 0


def test_json_object_is_any_compact_object(make_service, tokenizer):
    handle = make_service().compile(GrammarSpec.json_object())
    assert accepts(handle, tokenizer, '{"a":[1,{"b":null}],"c":"d"}')
    assert not accepts(handle, tokenizer, "[1,2]")
    assert not accepts(handle, tokenizer, '{"a": 1}')


# -- time limit -------------------------------------------------------------------------------


@pytest.fixture
def stuck_compile(monkeypatch):
    """compile_spec blocks for specs whose regex starts with 'stuck' until released."""
    release = threading.Event()
    started = threading.Event()
    real = service_module.compile_spec

    def fake(compiler, spec):
        if spec.kind == "regex" and spec.payload.startswith("stuck"):
            started.set()
            release.wait(30)
        return real(compiler, spec)

    monkeypatch.setattr(service_module, "compile_spec", fake)
    yield release, started
    release.set()


def test_compile_timeout_does_not_block_later_requests(make_service, stuck_compile, tokenizer):
    release, _ = stuck_compile
    svc = make_service(compile_timeout_s=0.3, workers=1)
    slow = GrammarSpec.regex("stuck[0-9]+")
    t0 = time.monotonic()
    with pytest.raises(GrammarCompileTimeout) as e:
        svc.compile(slow)
    assert time.monotonic() - t0 < 2.0
    assert "took longer than 0.3 s" in e.value.message and e.value.param == "regex"
    assert isinstance(e.value, GrammarSpecError)  # a 400 for the gateway

    # the only worker is stuck, yet a new request compiles at once on a replacement thread
    handle = svc.compile(GrammarSpec.regex("[a-z]+"))
    assert accepts(handle, tokenizer, "hello")
    assert svc.stats().abandoned_compiles_running == 1

    # the same slow spec again joins the running compile instead of starting another
    with pytest.raises(GrammarCompileTimeout):
        svc.compile(slow)
    assert svc.stats().misses == 2

    # once it finishes, its result is cached: a retry is a memory hit
    release.set()
    deadline = time.monotonic() + 10
    while svc.get_cached(slow) is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert accepts(svc.compile(slow), tokenizer, "stuck42")
    stats = svc.stats()
    assert stats.compile_timeouts == 2 and stats.abandoned_compiles_running == 0


def test_async_compile_times_out_without_blocking_the_loop(make_service, stuck_compile):
    svc = make_service(compile_timeout_s=0.3, workers=1)

    async def scenario():
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        task = asyncio.create_task(ticker())
        with pytest.raises(GrammarCompileTimeout):
            await svc.compile_async(GrammarSpec.regex("stuck-async"))
        fast = await svc.compile_async(GrammarSpec.regex("[0-9]+"))
        task.cancel()
        return ticks, fast

    ticks, fast = asyncio.run(scenario())
    assert ticks >= 10  # the event loop kept running while the compile was stuck
    assert isinstance(fast, CompiledGrammarHandle)


def test_runaway_compiles_past_the_cap_make_the_service_busy(make_service, stuck_compile):
    svc = make_service(compile_timeout_s=0.2, workers=1, max_abandoned_compiles=0)
    with pytest.raises(GrammarCompileTimeout):
        svc.compile(GrammarSpec.regex("stuck-1"))
    with pytest.raises(GrammarServiceBusy):
        svc.compile(GrammarSpec.regex("[a-z]"))


def test_concurrent_identical_requests_share_one_compile(make_service, stuck_compile):
    release, started = stuck_compile
    svc = make_service(compile_timeout_s=10, workers=2)
    spec = GrammarSpec.regex("stuck-shared")
    results: list = []
    threads = [threading.Thread(target=lambda: results.append(svc.compile(spec))) for _ in range(4)]
    for t in threads:
        t.start()
    assert started.wait(5)
    time.sleep(0.1)
    release.set()
    for t in threads:
        t.join(10)
    assert len(results) == 4 and len({id(r) for r in results}) == 1
    assert svc.stats().misses == 1


def test_specs_over_the_limits_are_refused_before_any_work(make_service):
    svc = make_service()
    deep: dict = {"type": "string"}
    for _ in range(100):
        deep = {"type": "array", "items": deep}
    with pytest.raises(GrammarSpecError, match="nested deeper"):
        svc.compile(GrammarSpec.json_schema(deep))
    stats = svc.stats()
    assert (stats.compile_errors, stats.misses) == (1, 0)
