"""Hierarchical KV cache, L1 (device pool) → L2 (host pool) → L3 (page files on disk), unit tests: the
tiers over small pools with recognizable KV (demotion, promotion, prefetch, pins, corrupt pages, a full disk)."""

from __future__ import annotations

import errno
import logging
import random
import time

import pytest
import torch

from runtime.kvcache.hiradix_cache import HiRadixCache
from runtime.kvcache.pool import KVPool
from runtime.kvcache.tiers.disk_store import DiskStore
from runtime.kvcache.tiers.host_pool import HostKVPool, gather_kv, scatter_kv

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
