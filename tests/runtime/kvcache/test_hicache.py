"""Hierarchical KV cache: L1 (device pool) → L2 (host pool) → L3 (page files on disk).

Unit tests run the tiers over small pools with recognizable KV; engine tests use the tiny random
Llama with real files in tmp_path: outputs equal the cache-off outputs, restarts reuse the disk
tier, corrupt/torn pages and a full disk are misses (never crashes), pinned prefixes stay in L1.
"""

from __future__ import annotations

import errno
import logging
import random
import time

import pytest
import torch

from runtime.api import EngineError, GenerateRequest
from runtime.decode.sampling import SamplingParams
from runtime.engine.engine import Engine
from runtime.kvcache.hiradix_cache import HiRadixCache
from runtime.kvcache.pool import KVPool
from runtime.kvcache.tiers.disk_store import DiskStore
from runtime.kvcache.tiers.host_pool import HostKVPool, gather_kv, scatter_kv
from tests.conftest import chat_ids

PAGE = 4
LAYERS, HEADS, DIM = 2, 1, 3


# ------------------------------------------------------------------------------ unit: the tiers


def make_cache(
    tmp_path=None, device_slots=32, host_slots=32, policy="write_through", min_load=1, disk_bytes=1 << 30
) -> HiRadixCache:
    kv = KVPool(LAYERS, device_slots, HEADS, DIM)
    host = HostKVPool.like(kv, host_slots)
    disk = None
    if tmp_path is not None:
        disk = DiskStore(tmp_path / "kv", "0" * 64, PAGE, LAYERS, HEADS, DIM, torch.float32, max_bytes=disk_bytes)
    return HiRadixCache(kv, host, PAGE, disk, policy, min_load, identity="0" * 64)


def token_kv(key, layers=LAYERS) -> torch.Tensor:
    """The KV a model would compute for `key`: a function of the whole prefix (so equal KV
    means the same prefix), shape [2, L, n, H, D]."""
    out = torch.empty(2, layers, len(key), HEADS, DIM)
    acc = 0
    for i, t in enumerate(key):
        acc = (acc * 31 + t) % 9973
        for side in range(2):
            for layer in range(layers):
                out[side, layer, i] = torch.tensor([acc, side, layer], dtype=torch.float32)
    return out


def compute(cache: HiRadixCache, key, namespace: str = "") -> int:
    """A request: match, lock, 'compute' the rest into fresh slots, insert, free as the caller must.
    Checks that every matched slot holds the right KV. Returns the matched length."""
    cache.load_back(key, namespace)  # as the engine does at admission
    m = cache.match_prefix(key, namespace)
    cache.lock(m.node)
    assert torch.equal(gather_kv(cache.kv, m.slots), token_kv(key)[:, :, : m.length]), "loaded KV differs"
    rest = len(key) - m.length
    if cache.allocator.num_free < rest:
        cache.evict(rest - cache.allocator.num_free)
    new = cache.allocator.alloc(rest)
    assert new is not None
    scatter_kv(cache.kv, new, token_kv(key)[:, :, m.length :])
    slots = torch.cat([m.slots, new])
    cache.cache_finished(list(key), slots, m.node, m.length, namespace)
    cache.check_invariant()
    return m.length


def on_disk(tmp_path, key) -> None:
    """`key` computed by a cache over `tmp_path` that is then closed: its pages are on disk only."""
    c = make_cache(tmp_path)
    compute(c, key)
    c.close()


def test_demote_then_promote_gives_identical_kv():
    c = make_cache(device_slots=16, host_slots=32, policy="write_back")
    a, b = list(range(100, 112)), list(range(200, 212))
    assert compute(c, a) == 0
    assert compute(c, b) == 0  # evicts a's 12 tokens: demoted to L2 (write_back copies only now)
    assert c.tier_lengths(a) == {"device": 0, "host": 12, "disk": 0}
    assert c.tier_counters["hicache_demoted_tokens"] >= 12
    assert compute(c, a + [1, 2, 3, 4]) == 12  # promoted back into L1, KV checked inside
    assert c.tier_counters["hicache_loaded_host_tokens"] == 12
    c.check_invariant()


def test_accounting_invariants_across_tiers_random_workload(tmp_path):
    rng = random.Random(0)
    for policy in ("write_through", "write_through_selective", "write_back"):
        c = make_cache(tmp_path / policy, device_slots=24, host_slots=24, policy=policy, min_load=4)
        prefixes = [[rng.randrange(50) for _ in range(8)] for _ in range(5)]
        for _ in range(60):
            key = rng.choice(prefixes) + [rng.randrange(50) for _ in range(rng.randrange(0, 9))]
            compute(c, key, namespace=rng.choice(["", "t1"]))
        assert c.tier_counters["hicache_demoted_tokens"] > 0 and c.tier_counters["hicache_host_evicted_tokens"] > 0
        c.close()


def test_random_workload_with_pins_and_prefetch_keeps_every_invariant(tmp_path):
    """Requests, pins (a locked match held across other requests) and prefetches in random order
    over small pools, so nodes split, move between all three tiers and leave the tree."""
    for seed in range(8):
        rng = random.Random(seed)
        policy = ("write_through", "write_through_selective", "write_back")[seed % 3]
        c = make_cache(
            tmp_path / str(seed) if seed % 2 else None,
            device_slots=rng.choice([16, 24, 40]),
            host_slots=rng.choice([8, 16, 24]),
            policy=policy,
            min_load=rng.choice([1, 4, 8]),
        )
        prefixes = [[rng.randrange(30) for _ in range(rng.randrange(4, 14))] for _ in range(6)]
        pins = []
        for _ in range(120):
            key = rng.choice(prefixes) + [rng.randrange(30) for _ in range(rng.randrange(0, 9))]
            ns, roll = rng.choice(["", "t1"]), rng.random()
            if roll < 0.1:
                c.load_back(key, ns)
                m = c.match_prefix(key, ns)
                c.lock(m.node)
                pins.append(m.node)
            elif roll < 0.2 and pins:
                c.unlock(pins.pop(rng.randrange(len(pins))))
            elif roll < 0.25:
                c.prefetch(key, ns)
            elif c.allocator.num_free + c.evictable_size >= len(key):  # pins may hold the pool
                compute(c, key, ns)
            c.check_invariant()
        for node in pins:
            c.unlock(node)
        c.check_invariant()
        c.close()


def test_host_eviction_goes_to_disk_and_comes_back(tmp_path):
    c = make_cache(tmp_path, device_slots=8, host_slots=8, policy="write_back")
    keys = [list(range(k * 10, k * 10 + 8)) for k in range(4)]
    for key in keys:
        compute(c, key)
    c.disk.flush()
    assert c.disk.num_pages > 0
    assert c.tier_lengths(keys[0]) == {"device": 0, "host": 0, "disk": 8}
    assert compute(c, keys[0]) == 8  # from disk, KV checked inside
    assert c.tier_counters["hicache_loaded_disk_tokens"] == 8
    c.close()


def test_loads_below_threshold_are_recomputed():
    c = make_cache(device_slots=8, host_slots=16, policy="write_back", min_load=8)
    compute(c, [1, 2, 3, 4, 9])  # caches one page
    compute(c, [5, 6, 7, 8, 10, 11, 12, 13])  # evicts it to L2
    assert c.tier_lengths([1, 2, 3, 4, 9]) == {"device": 0, "host": 4, "disk": 0}
    assert compute(c, [1, 2, 3, 4, 9]) == 0  # 4 < 8 tokens: recomputed
    c.check_invariant()


def test_restart_rebuilds_the_disk_index(tmp_path):
    key = list(range(40, 52))
    on_disk(tmp_path, key)
    c2 = make_cache(tmp_path)
    assert c2.tier_lengths(key + [7]) == {"device": 0, "host": 0, "disk": 12}
    assert compute(c2, key + [7]) == 12
    assert c2.tier_lengths(key, namespace="other")["disk"] == 0  # namespaces never share pages
    c2.close()


@pytest.mark.parametrize("damage", ["flip", "truncate", "header"])
def test_corrupt_page_is_a_miss_and_deleted(tmp_path, caplog, damage):
    key = list(range(60, 72))
    on_disk(tmp_path, key)
    files = sorted((tmp_path / "kv").rglob("*.kv"))
    assert len(files) == 3
    victim = files[0]
    raw = bytearray(victim.read_bytes())
    if damage == "flip":
        raw[-5] ^= 0xFF
    elif damage == "truncate":
        raw = raw[: len(raw) // 2]
    else:
        raw[:4] = b"XXXX"
    victim.write_bytes(bytes(raw))
    c2 = make_cache(tmp_path, policy="write_back")  # write_back: the recomputed page is not rewritten at once
    with caplog.at_level(logging.WARNING, logger="jumpgate.hicache"):
        matched = compute(c2, key)  # KV of whatever loaded is checked inside
    assert matched < 12
    assert not victim.exists()
    assert c2.disk.stats["disk_corrupt_pages"] >= 1
    assert any("corrupt" in r.message for r in caplog.records)
    c2.close()


def test_disk_full_is_a_warning_and_a_miss(tmp_path, caplog, monkeypatch):
    def full(self, h, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(DiskStore, "write_page_file", full)
    c = make_cache(tmp_path, device_slots=8, host_slots=8)
    with caplog.at_level(logging.WARNING, logger="jumpgate.hicache"):
        for k in range(4):
            compute(c, list(range(k * 10, k * 10 + 8)))
        c.disk.flush()
    assert c.disk.stats["disk_write_errors"] > 0 and c.disk.num_pages == 0
    assert any("No space left" in r.message for r in caplog.records)
    assert compute(c, list(range(0, 8))) == 0  # nothing on disk: recomputed
    c.close()
    assert not list((tmp_path / "kv").rglob("*.tmp"))


def test_disk_budget_evicts_oldest_pages(tmp_path):
    page_bytes = 2 * LAYERS * PAGE * HEADS * DIM * 4 + 64
    c = make_cache(tmp_path, disk_bytes=3 * page_bytes)
    for k in range(3):
        compute(c, list(range(k * 10, k * 10 + 8)))
    c.disk.flush()
    assert c.disk.num_pages == 3 and c.disk.used_bytes <= 3 * page_bytes
    assert c.disk.stats["disk_pages_evicted"] == 3
    c.close()


def test_prefetch_reads_ahead(tmp_path):
    key = list(range(80, 96))
    on_disk(tmp_path, key)
    c2 = make_cache(tmp_path)
    c2.prefetch(key)
    assert c2.tier_counters["hicache_prefetched_pages"] == 4
    while c2.loading(key):  # the reader pool finishes the reads
        time.sleep(0.01)
    assert c2.disk_tier.staged_pages == 4
    assert compute(c2, key + [1]) == 16
    assert c2.disk_tier.staged_pages == 0  # taken by the load
    c2.close()


def test_match_prefix_never_loads_and_load_back_does(tmp_path):
    c = make_cache(tmp_path, device_slots=16, host_slots=32, policy="write_back")
    a, b = list(range(100, 112)), list(range(200, 212))
    compute(c, a)
    compute(c, b)  # a's 12 tokens demoted to L2
    assert c.tier_lengths(a) == {"device": 0, "host": 12, "disk": 0}
    m = c.match_prefix(a + [1])
    assert m.length == 0 and c.tier_lengths(a)["host"] == 12  # pure: device only, nothing moved
    assert c.tier_counters["hicache_loaded_host_tokens"] == 0
    assert c.prefix_match_length(a + [1]) == 12  # scheduling still sees every tier
    assert c.load_back(a + [1]) == 12
    assert c.tier_lengths(a) == {"device": 12, "host": 0, "disk": 0}
    assert c.match_prefix(a + [1]).length == 12
    c.check_invariant()
    c.close()
    c2 = make_cache(tmp_path)  # a restart: a's pages only on disk
    assert c2.match_prefix(a).length == 0 and c2.tier_lengths(a)["disk"] == 12
    assert c2.load_back(a) == 12 and c2.match_prefix(a).length == 12
    c2.check_invariant()
    c2.close()


def test_write_through_selective_copies_down_on_the_second_admission():
    c = make_cache(device_slots=32, host_slots=32, policy="write_through_selective")
    key = list(range(8))
    compute(c, key)
    assert c.tier_counters["hicache_backed_up_tokens"] == 0
    compute(c, key + [9])  # first admission that uses it
    assert c.tier_counters["hicache_backed_up_tokens"] == 0
    c.match_prefix(key)  # a re-match (e.g. after the engine's own insert) is no admission
    compute(c, key + [9])
    assert c.tier_counters["hicache_backed_up_tokens"] == 8


def test_pinned_node_is_never_demoted():
    c = make_cache(device_slots=16, host_slots=16)
    key = list(range(8))
    compute(c, key)
    m = c.match_prefix(key)
    c.lock(m.node)  # a pin
    for k in range(1, 5):
        compute(c, list(range(k * 10, k * 10 + 8)))
    assert c.tier_lengths(key)["device"] == 8
    c.unlock(m.node)
    c.check_invariant()


# ------------------------------------------------------------------------------ the engine

SYSTEM = "You are a helpful assistant for a travel agency. " * 6
QUESTIONS = [
    "Plan a trip to Rome.",
    "Best time to visit Oslo?",
    "Cheap flights to Lima?",
    "Pack for a ski trip.",
    "Visa rules for Japan?",
    "Museums in Paris?",
]


def _prompts(tokenizer):
    # distinct system prompts, so the working set is several times the device pool
    return [chat_ids(tokenizer, q, system=f"Agent {i}. " + SYSTEM) for i, q in enumerate(QUESTIONS)]


def _greedy(n=12):
    return SamplingParams(max_new_tokens=n, temperature=0.0, ignore_eos=True)


def _serve(engine: Engine, prompts, rounds=1):
    """Requests one at a time, `rounds` passes over the prompts: (token ids, cached tokens) each."""
    out = []
    for _ in range(rounds):
        for p in prompts:
            r = engine.generate_many([GenerateRequest(p, _greedy())], timeout=300)[0]
            out.append((r.token_ids, r.cached_tokens))
            engine.check_invariant()
    return out


@pytest.fixture(scope="module")
def expected(tiny_model_dir, tokenizer):
    prompts = _prompts(tokenizer)
    with Engine(model=str(tiny_model_dir), radix_cache=False, kv_pool_tokens=4096) as e:
        return prompts, [ids for ids, _ in _serve(e, prompts)]


def tiered(model_dir, tmp_path, **cfg) -> Engine:
    longest = 200
    base = dict(
        model=str(model_dir),
        kv_pool_tokens=2 * longest,
        host_pool_tokens=8 * longest,
        disk_cache_dir=str(tmp_path / "kvcache"),
        hicache_page_tokens=16,
        hicache_min_load_tokens=16,
        debug_invariants=True,
    )
    base.update(cfg)
    return Engine(**base)


@pytest.mark.parametrize("policy", ["write_through", "write_through_selective", "write_back"])
def test_tiers_give_the_cache_off_outputs(tiny_model_dir, tmp_path, expected, policy):
    prompts, want = expected
    with tiered(tiny_model_dir, tmp_path, hicache_write_policy=policy) as e:
        got = _serve(e, prompts, rounds=2)
        stats = e.stats()
    assert [ids for ids, _ in got] == want * 2
    second = [cached for _, cached in got[len(prompts) :]]
    assert all(c > 0 for c in second), second  # every revisit hits a lower tier
    assert stats.tier_counters["hicache_demoted_tokens"] > 0 and stats.tier_counters["hicache_loaded_host_tokens"] > 0
    assert stats.kv_slots_request_only == 0


def test_batched_requests_with_eviction_and_retraction(tiny_model_dir, tmp_path, tokenizer, expected):
    prompts, want = expected
    with tiered(tiny_model_dir, tmp_path, kv_pool_tokens=300, host_pool_tokens=600) as e:
        first = e.generate_many([GenerateRequest(p, _greedy()) for p in prompts], timeout=300)
        again = e.generate_many([GenerateRequest(p, _greedy()) for p in prompts], timeout=300)
        e.check_invariant()
    assert [r.token_ids for r in first] == want and [r.token_ids for r in again] == want
    assert sum(r.cached_tokens for r in again) > 0


def test_restart_reuses_the_disk_tier(tiny_model_dir, tmp_path, expected):
    prompts, want = expected
    with tiered(tiny_model_dir, tmp_path, hicache_write_policy="write_back") as e:
        _serve(e, prompts[:2])
    with tiered(tiny_model_dir, tmp_path) as e:  # a new process: empty L1/L2, same folder
        info = e.explain_prefix(prompts[0])
        got = _serve(e, prompts[:2])
        stats = e.stats()
    assert info.by_tier["disk"] > 0 and info.cached_tokens == info.by_tier["disk"]
    assert [ids for ids, _ in got] == want[:2]
    assert all(cached > 0 for _, cached in got)
    assert stats.tier_counters["hicache_loaded_disk_tokens"] > 0
    assert stats.tier_counters["hicache_prefetched_pages"] > 0  # read ahead when the request was queued


def test_another_weight_format_never_reads_the_pages(tiny_model_dir, tmp_path, expected):
    """The pages' identity includes the weight format and the attention arithmetic: a bf16 engine
    does not read an fp32 engine's KV (it would answer with fp32's prefix bits, not its own)."""
    from runtime.kvcache.tiers.disk_store import model_identity

    prompts, want = expected
    with tiered(tiny_model_dir, tmp_path, weights="fp32", hicache_write_policy="write_back") as e:
        _serve(e, prompts[:2])
    with tiered(tiny_model_dir, tmp_path, weights="bf16") as e:
        assert e.explain_prefix(prompts[0]).by_tier["disk"] == 0
        bf16_stats = e.stats()
    assert bf16_stats.tier_counters["hicache_loaded_disk_tokens"] == 0
    with tiered(tiny_model_dir, tmp_path, weights="fp32") as e:  # its own pages are still there
        assert e.explain_prefix(prompts[0]).by_tier["disk"] > 0
        assert [ids for ids, _ in _serve(e, prompts[:2])] == want[:2]
    ids = {model_identity(tiny_model_dir, torch.float32, 2, 2, 16, n) for n in ("", "q4 cpu", "q4 cpu-amx", "fp32 cpu")}
    assert len(ids) == 4


def test_corrupt_pages_after_restart_are_recomputed(tiny_model_dir, tmp_path, expected, caplog):
    prompts, want = expected
    with tiered(tiny_model_dir, tmp_path) as e:
        _serve(e, prompts[:1])
    files = sorted((tmp_path / "kvcache").rglob("*.kv"))
    assert files
    for f in files:  # flip a byte in every page
        raw = bytearray(f.read_bytes())
        raw[100] ^= 0x5A
        f.write_bytes(bytes(raw))
    with caplog.at_level(logging.WARNING, logger="jumpgate.hicache"):
        with tiered(tiny_model_dir, tmp_path) as e:
            got = _serve(e, prompts[:1])
    assert got[0] == (want[0], 0)
    assert any("corrupt" in r.message for r in caplog.records)


def test_disk_full_still_serves(tiny_model_dir, tmp_path, expected, monkeypatch, caplog):
    prompts, want = expected

    def full(self, h, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(DiskStore, "write_page_file", full)
    with caplog.at_level(logging.WARNING, logger="jumpgate.hicache"):
        with tiered(tiny_model_dir, tmp_path, host_pool_tokens=300) as e:
            got = _serve(e, prompts, rounds=2)
            stats = e.stats()
    assert [ids for ids, _ in got] == want * 2
    assert stats.tier_counters["disk_write_errors"] > 0 and stats.tier_counters["disk_pages"] == 0
    assert any("No space left" in r.message for r in caplog.records)


def test_pinned_prefix_stays_resident_and_budget_is_enforced(tiny_model_dir, tmp_path, tokenizer, expected):
    prompts, want = expected
    prefix = chat_ids(tokenizer, "", system="Pinned agent. " + SYSTEM)[:-8]
    with tiered(tiny_model_dir, tmp_path, pin_budget_tokens=len(prefix) + 10) as e:
        pinned = e.pin_prefix(prefix, name="schema:a")
        assert 0 < pinned <= len(prefix) and pinned > len(prefix) - 16
        assert e.pin_prefix(prefix, name="schema:a") == pinned  # idempotent
        _serve(e, prompts, rounds=2)  # eviction pressure: the pool holds about two prompts
        assert e.explain_prefix(prefix).by_tier["device"] == pinned
        with pytest.raises(EngineError) as err:
            e.pin_prefix(prompts[0], name="schema:b")
        assert err.value.code == "pin_budget_exceeded" and "pin budget" in err.value.message
        assert e.unpin_prefix(name="schema:a") == pinned
        assert e.pin_prefix(prompts[0][:64], name="schema:b") == 64  # room again
        e.check_invariant()


def test_pinning_works_without_tiers_and_is_off_by_default(tiny_model_dir, tokenizer):
    prefix = chat_ids(tokenizer, "", system=SYSTEM)
    with Engine(model=str(tiny_model_dir), kv_pool_tokens=1024) as e:
        with pytest.raises(EngineError, match="pinning is off"):
            e.pin_prefix(prefix)
    with Engine(model=str(tiny_model_dir), kv_pool_tokens=1024, pin_budget_tokens=500) as e:
        assert e.pin_prefix(prefix) == len(prefix)
        assert e.stats().kv_slots_evictable == 0
        assert e.unpin_prefix(prefix) == len(prefix)


def test_tiers_off_by_default(tiny_model_dir):
    with Engine(model=str(tiny_model_dir), kv_pool_tokens=256) as e:
        assert type(e.cache.prefix_cache).__name__ == "RadixCache"
        assert "host_slots_total" not in e.stats().tier_counters
    with pytest.raises(ValueError, match="host_pool_tokens"):
        Engine(model=str(tiny_model_dir), kv_pool_tokens=256, disk_cache_dir="/tmp/x")


# ------------------------------------------------------------------------------ the gateway hook

POINT = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}


def test_schema_prefix_is_a_prefix_of_every_request_using_it(tokenizer):
    from gateway.pipeline.prompt import PromptRenderer, schema_instructions
    from gateway.protocol import SystemMessage, UserMessage
    from gateway.registry.pinning import schema_prefix_ids

    renderer = PromptRenderer(tokenizer)
    for system in ("You are a geometry bot.", None):
        ids = schema_prefix_ids(renderer, "json_schema", POINT, system)
        head = [SystemMessage(content=system)] if system else []
        for user in ("Give me a point.", "x?"):
            req = renderer.render_chat(
                [*head, UserMessage(content=user)], None, schema_instructions("json_schema", POINT)
            ).token_ids
            assert req[: len(ids)] == ids
        text = renderer.decode(ids)
        assert "conforms to this JSON schema" in text and "user" not in text.rsplit("<|im_end|>", 1)[-1]


def test_pin_on_upload_and_unpin_on_delete(gateway_client, fake_engine):
    pins = {}
    budget = {"tokens": 1000}

    def pin_prefix(ids, namespace="", name=None):
        if len(ids) > budget["tokens"]:
            raise EngineError("pinning would exceed the pin budget", code="pin_budget_exceeded", param="pin")
        pins[(namespace, name)] = len(ids)
        return len(ids) - 3

    fake_engine.pin_prefix = pin_prefix
    fake_engine.unpin_prefix = lambda namespace="", name=None: pins.pop((namespace, name), 0)
    client = gateway_client()
    resp = client.post("/v1/schemas", json={"schema": POINT, "pin": True, "system_prompt": "Be terse."})
    assert resp.status_code == 201, resp.text
    entry = resp.json()
    assert entry["pinned_tokens"] > 0 and list(pins) == [("", f"schema:{entry['id']}")]
    assert client.delete(f"/v1/schemas/{entry['id']}").status_code == 200
    assert pins == {}

    budget["tokens"] = 5  # the engine's pin budget is used up (a long schema text is compacted, so shrink the budget)
    refused = client.post("/v1/schemas", json={"schema": POINT, "pin": True})
    assert refused.status_code == 400
    err = refused.json()["error"]
    assert err["code"] == "pin_budget_exceeded" and "pin budget" in err["message"] and err["param"] == "pin"
    assert client.get("/v1/schemas").json()["data"] == []  # a refused pin registers nothing


def test_pin_refused_when_the_engine_cannot_pin(gateway_client):
    resp = gateway_client().post("/v1/schemas", json={"schema": POINT, "pin": True})
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "pinning_unavailable"
