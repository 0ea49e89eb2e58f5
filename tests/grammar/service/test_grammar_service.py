"""GrammarService: memory LRU, disk cache across restarts, corrupt files, time and memory limits
(real compiles in real compile processes), single flight."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time

import pytest

from grammar import (
    CompiledGrammarHandle,
    GrammarCompileMemoryError,
    GrammarCompileTimeout,
    GrammarService,
    GrammarServiceBusy,
    GrammarSpec,
    GrammarSpecError,
)
from grammar.service.cache import MemoryLRU

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}


@pytest.fixture(scope="module")
def vocab_size(smollm_dir):
    from runtime.model.loader import read_config

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
    files = list(tmp_path.rglob("*.json"))
    assert files == [first.disk_folder / f"{first.key(spec)}.json"]  # in the tokenizer's own namespace
    assert not list(first.disk_folder.glob(".*"))  # no temp file left behind

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
    first = make_service(cache_dir=tmp_path)
    first.compile(spec)
    path = next(first.disk_folder.glob("*.json"))
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
    folder = make_service(cache_dir=tmp_path).disk_folder
    stale, fresh = folder / ".0123456789abcdef.killed.tmp", folder / ".0123456789abcdef.live.tmp"
    for f in (stale, fresh):
        f.write_text("{")
    old = time.time() - 3600
    os.utime(stale, (old, old))
    make_service(cache_dir=tmp_path)
    assert not stale.exists() and fresh.exists()


def test_another_tokenizers_grammars_are_skipped_and_kept(
    make_service, tmp_path, tokenizer, other_tokenizer, other_model_dir
):
    """Two models share the cache folder: neither opens, evicts nor deletes the other's grammars."""
    from runtime.model.loader import read_config

    spec = GrammarSpec.json_schema(SCHEMA)
    first = make_service(cache_dir=tmp_path)
    first.compile(spec)
    ours = {p: p.read_bytes() for p in tmp_path.rglob("*.json")}
    assert len(ours) == 1

    other = GrammarService(
        other_tokenizer, read_config(other_model_dir).vocab_size, cache_dir=tmp_path, max_disk_bytes=1
    )  # a budget too small for anything but its own newest file
    try:
        assert other.warm_from_disk() == 0  # the first model's grammar is not its to load
        other.compile(spec)
        assert (other.stats().disk_hits, other.stats().misses) == (0, 1)
        assert other.disk_folder != first.disk_folder
    finally:
        other.close()
    assert {p: p.read_bytes() for p in ours} == ours  # still there, unchanged
    assert len(list(tmp_path.rglob("*.json"))) == 2  # and the other's beside it

    again = make_service(cache_dir=tmp_path)  # the first model's next start uses its grammar
    assert again.warm_from_disk() == 1 and again.stats().disk_loaded == 1
    assert accepts(again.compile(spec), tokenizer, '{"name":"Ada"}')
    assert again.stats().misses == 0


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


# -- time and memory limits (compiles run in killable processes: grammar/service/compile_process.py) ---


def runaway_ebnf(rules: int = 10_000) -> GrammarSpec:
    """A grammar of many sequential rules: xgrammar's compile is super-linear in them (10,000 take
    about 13 s and 220 MB here), and serializing the result more so (1,000 rules: past 4 GB)."""
    return GrammarSpec.ebnf(
        "root ::= "
        + " ".join(f"r{i}" for i in range(rules))
        + "\n"
        + "\n".join(f'r{i} ::= "k{i}" | [0-9]+' for i in range(rules))
    )


RUNAWAY = runaway_ebnf()
BIG_ENUM = GrammarSpec.json_schema({"enum": [f"value-{i}" for i in range(20_000)]})  # ~40 MB of masks


def ready_service(make_service, **kw):
    """A service whose compile processes have started (so a short limit measures only the compile)."""
    svc = make_service(**kw)
    svc.start(wait=True)
    assert len(svc.compile_process_pids()) == kw.get("workers", 2)
    return svc


def test_a_compile_past_the_limit_is_killed_and_later_requests_compile(make_service, tokenizer):
    svc = ready_service(make_service, compile_timeout_s=0.5, workers=1)
    [before] = svc.compile_process_pids()
    t0 = time.monotonic()
    with pytest.raises(GrammarCompileTimeout) as e:
        svc.compile(RUNAWAY)
    assert time.monotonic() - t0 < 3.0
    assert "took longer than 0.5 s" in e.value.message and e.value.param == "ebnf"
    assert isinstance(e.value, GrammarSpecError)  # a 400 for the gateway

    # the only worker's process was killed and replaced: a new request compiles at once
    handle = svc.compile(GrammarSpec.regex("[a-z]+"))
    assert accepts(handle, tokenizer, "hello")
    [after] = svc.compile_process_pids()
    assert after != before and not pid_alive(before)
    stats = svc.stats()
    assert (stats.compile_timeouts, stats.compile_processes_replaced) == (1, 1)
    assert svc.get_cached(RUNAWAY) is None  # killed: nothing lands in the cache later


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # reaped children vanish; a zombie would still be listed
        return f.read().split()[2] != "Z"


def test_a_waiter_that_joins_extends_the_compile_s_deadline(make_service):
    """Single flight: a second request for the same spec joins the running compile, and the
    compile is killed only when the last waiter's limit has passed."""
    svc = ready_service(make_service, compile_timeout_s=1.5, workers=1)
    [pid] = svc.compile_process_pids()
    errors: list = []

    def wait() -> None:
        try:
            svc.compile(RUNAWAY)
        except GrammarCompileTimeout as e:
            errors.append((time.monotonic(), e))

    first = threading.Thread(target=wait)
    first.start()
    time.sleep(1.0)
    second = threading.Thread(target=wait)
    second.start()
    first.join(10)
    assert len(errors) == 1
    time.sleep(0.3)  # the first waiter gave up; the compile still runs for the second one
    assert svc.compile_process_pids() == [pid] and svc.stats().compile_processes_replaced == 0
    second.join(10)
    assert len(errors) == 2 and errors[1][0] - errors[0][0] > 0.6
    stats = svc.stats()
    assert (stats.misses, stats.compile_timeouts) == (1, 2)  # one compile, shared
    deadline = time.monotonic() + 5
    while svc.stats().compile_processes_replaced < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert svc.stats().compile_processes_replaced == 1 and not pid_alive(pid)


def test_async_compile_times_out_without_blocking_the_loop(make_service):
    svc = ready_service(make_service, compile_timeout_s=0.5, workers=1)

    async def scenario():
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        task = asyncio.create_task(ticker())
        with pytest.raises(GrammarCompileTimeout):
            await svc.compile_async(RUNAWAY)
        fast = await svc.compile_async(GrammarSpec.regex("[0-9]+"))
        task.cancel()
        return ticks, fast

    ticks, fast = asyncio.run(scenario())
    assert ticks >= 10  # the event loop kept running while the compile ran
    assert isinstance(fast, CompiledGrammarHandle)


def test_a_compile_past_the_memory_limit_is_refused_clearly(make_service, tokenizer):
    svc = ready_service(make_service, compile_memory_bytes=64 << 20, workers=1)
    with pytest.raises(GrammarCompileMemoryError) as e:
        svc.compile(BIG_ENUM)
    assert "exceeded the grammar compiler's memory limit of 0.0625 GiB (an allocation failed)" in e.value.message
    assert e.value.param == "response_format" and isinstance(e.value, GrammarSpecError)
    assert accepts(svc.compile(GrammarSpec.regex("[a-z]+")), tokenizer, "ok")  # the replacement compiles
    stats = svc.stats()
    assert (stats.compile_memory_errors, stats.compile_errors, stats.compile_processes_replaced) == (1, 1, 1)


def required_integers(n: int) -> dict:
    """n required properties: compiles in about a second at 4000 (10 MB), but xgrammar 0.2.9's
    serialize_json writes the whole FSM once per rule, so serializing it would need > 3 GB."""
    return {
        "type": "object",
        "properties": {f"p{i}": {"type": "integer"} for i in range(n)},
        "required": [f"p{i}" for i in range(n)],
        "additionalProperties": False,
    }


def test_a_grammar_too_big_to_serialize_is_compiled_in_process_for_memory_only(make_service, tmp_path, tokenizer):
    svc = ready_service(
        make_service,
        cache_dir=tmp_path,
        compile_timeout_s=60,
        compile_memory_bytes=3 << 30,
        workers=1,
        max_memory_entries=1,
    )
    spec = GrammarSpec.json_schema(required_integers(4000))
    handle = svc.compile(spec)
    assert accepts(handle, tokenizer, "{" + ",".join(f'"p{i}":{i}' for i in range(4000)) + "}")
    assert svc.compile(spec) is handle  # served from memory
    assert not list(svc.disk_folder.iterdir())  # never on disk (nor a temp file)
    stats = svc.stats()
    assert (stats.misses, stats.memory_hits, stats.compile_unserializable) == (1, 1, 1)
    assert (stats.compile_errors, stats.compile_memory_errors, stats.compile_timeouts) == (0, 0, 0)

    svc.compile(GrammarSpec.regex("evict[0-9]"))  # a normal grammar: on disk, and evicts the big one
    assert len(list(svc.disk_folder.glob("*.json"))) == 1
    replaced = svc.stats().compile_processes_replaced
    again = svc.compile(spec)  # a miss again: compiled in-process directly, no serialization retried
    assert again is not handle and again.memory_size_bytes == handle.memory_size_bytes
    stats = svc.stats()
    assert (stats.misses, stats.compile_unserializable, stats.compile_processes_replaced) == (3, 2, replaced)
    assert len(list(svc.disk_folder.glob("*.json"))) == 1


def test_concurrent_identical_requests_share_one_compile(make_service):
    svc = ready_service(make_service, compile_timeout_s=60, workers=2)
    spec = GrammarSpec.json_schema({"enum": [f"shared-{i}" for i in range(5000)]})  # about a second
    results: list = []
    threads = [threading.Thread(target=lambda: results.append(svc.compile(spec))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(results) == 4 and len({id(r) for r in results}) == 1
    assert svc.stats().misses == 1


def test_close_stops_the_compile_processes(make_service):
    svc = ready_service(make_service, workers=2)
    pids = svc.compile_process_pids()
    assert len(pids) == 2 and all(pid_alive(p) for p in pids)
    svc.close()
    assert svc.compile_process_pids() == [] and not any(pid_alive(p) for p in pids)
    with pytest.raises(GrammarServiceBusy):
        svc.compile(GrammarSpec.regex("after-close"))


def test_specs_over_the_limits_are_refused_before_any_work(make_service):
    svc = make_service()
    deep: dict = {"type": "string"}
    for _ in range(100):
        deep = {"type": "array", "items": deep}
    with pytest.raises(GrammarSpecError, match="nested deeper"):
        svc.compile(GrammarSpec.json_schema(deep))
    stats = svc.stats()
    assert (stats.compile_errors, stats.misses) == (1, 0)
