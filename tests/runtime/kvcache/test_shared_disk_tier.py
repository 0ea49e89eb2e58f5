"""The disk KV tier on one folder shared by several processes (engine replicas, docs/cluster.md).

Real processes (multiprocessing, spawn) on real files in tmp_path: concurrent writers and readers
of one folder, a byte budget that holds for the whole folder, temp files of live writers left
alone, corrupt pages as counted misses, and an engine that loads the prefix pages another
engine process wrote instead of recomputing them (same outputs as a recompute).
"""

from __future__ import annotations

import multiprocessing
import os
import time

import torch

from runtime.api import GenerateRequest
from runtime.decode.sampling import SamplingParams
from runtime.engine.engine import Engine
from runtime.kvcache.tiers.disk_store import DiskStore, chain_hash, chain_seed
from runtime.kvcache.tiers.shared_folder import STALE_TEMP_S, temp_name
from tests.conftest import chat_ids

PAGE, LAYERS, HEADS, DIM = 4, 2, 1, 3
IDENTITY = "ab" * 32
SPAWN = multiprocessing.get_context("spawn")  # a fresh interpreter, as a Ray replica is


def page_hash(i: int, namespace: str = "") -> bytes:
    return chain_hash(chain_seed(IDENTITY, PAGE, namespace), [i, i + 1, i + 2, i + 3])


def page_data(i: int) -> torch.Tensor:
    return torch.arange(2 * LAYERS * PAGE * HEADS * DIM, dtype=torch.float32).view(2, LAYERS, PAGE, HEADS, DIM) + i


def same(data: torch.Tensor | None, i: int) -> bool:
    return data is not None and torch.equal(data, page_data(i))


def open_store(root, max_bytes=1 << 30, sync_s=5.0, identity=IDENTITY) -> DiskStore:
    return DiskStore(root, identity, PAGE, LAYERS, HEADS, DIM, torch.float32, max_bytes=max_bytes, sync_s=sync_s)


def page_files(root):
    return sorted(root.rglob("*.kv"))


# ------------------------------------------------------------------------------ worker processes


def write_then_read_all(root, mine, everyone, barrier, out):
    """Write `mine` (overlapping another writer's), then once both are done read every page."""
    store = open_store(root, sync_s=0.0)  # re-read the folder before every write: the busiest case
    for i in mine:
        store.write(page_hash(i), page_data(i))
    store.flush()
    barrier.wait(timeout=120)
    wrong = [i for i in everyone if not store.contains(page_hash(i)) or not same(store.read(page_hash(i)), i)]
    store.close()
    out.put((os.getpid(), wrong, dict(store.stats)))


def write_pages(root, pages, max_bytes, out=None, barrier=None):
    store = open_store(root, max_bytes=max_bytes, sync_s=0.0)
    if barrier is not None:  # both opened the folder before either writes
        barrier.wait(timeout=120)
    for i in pages:
        store.write(page_hash(i), page_data(i), block=True)
    store.close()
    if out is not None:
        out.put(dict(store.stats))


def run_processes(targets):
    procs = [SPAWN.Process(target=fn, args=args) for fn, args in targets]
    for p in procs:
        p.start()
    return procs


def join_all(procs):
    for p in procs:
        p.join(timeout=180)
        assert p.exitcode == 0, f"worker exit code {p.exitcode}"


# ------------------------------------------------------------------------------ the store


def test_two_processes_write_and_read_one_folder_concurrently(tmp_path):
    root = tmp_path / "kv"
    barrier, out = SPAWN.Barrier(2), SPAWN.Queue()
    everyone = list(range(60))
    procs = run_processes(
        [
            (write_then_read_all, (root, range(0, 40), everyone, barrier, out)),
            (write_then_read_all, (root, range(20, 60), everyone, barrier, out)),
        ]
    )
    results = [out.get(timeout=180) for _ in procs]
    join_all(procs)
    for _, wrong, stats in results:
        assert wrong == []  # each read every page, the other's included, byte for byte
        assert stats["disk_write_errors"] == 0 and stats["disk_corrupt_pages"] == 0
    # each found pages only the other wrote: by a lookup or a re-read of the folder
    assert not list(root.rglob("*.tmp"))
    assert len(page_files(root)) == 60
    fresh = open_store(root)
    assert all(torch.equal(fresh.read(page_hash(i)), page_data(i)) for i in everyone)
    assert fresh.stats["disk_corrupt_pages"] == 0


def test_the_byte_budget_holds_for_the_whole_folder(tmp_path):
    """Two writers with one budget evict each other's pages (files the other may have deleted
    already) and keep the folder near the budget, not at twice it."""
    root = tmp_path / "kv"
    probe = open_store(root)
    page_bytes = probe.page_bytes + 64  # a file: header and payload
    probe.close()
    budget = 10 * page_bytes
    out, barrier = SPAWN.Queue(), SPAWN.Barrier(2)
    procs = run_processes(
        [
            (write_pages, (root, range(0, 40), budget, out, barrier)),
            (write_pages, (root, range(100, 140), budget, out, barrier)),
        ]
    )
    stats = [out.get(timeout=180) for _ in procs]
    join_all(procs)
    used = sum(f.stat().st_size for f in page_files(root))
    assert used <= budget + 2 * page_bytes, (used, budget)
    assert all(s["disk_write_errors"] == 0 and s["disk_pages_written"] == 40 for s in stats)
    assert sum(s["disk_pages_evicted"] for s in stats) >= 80 - 12


def test_pages_another_process_wrote_after_start_are_found_by_their_key(tmp_path):
    root = tmp_path / "kv"
    store = open_store(root)  # started first: its own scan of the folder finds nothing
    assert not store.contains(page_hash(0))
    join_all(run_processes([(write_pages, (root, range(5), 1 << 30))]))
    assert all(store.contains(page_hash(i)) for i in range(5))
    assert all(torch.equal(store.read(page_hash(i)), page_data(i)) for i in range(5))
    assert store.stats["disk_pages_adopted"] == 5 and store.stats["disk_pages_read"] == 5
    # the key holds the namespace and the model identity: another tenant or model finds nothing
    assert not store.contains(page_hash(0, namespace="tenant-b"))
    assert not open_store(root, identity="cd" * 32).contains(page_hash(0))
    store.close()


def test_a_page_deleted_by_another_process_is_a_miss_and_leaves_the_index(tmp_path):
    root = tmp_path / "kv"
    a, b = open_store(root), open_store(root)
    a.write(page_hash(1), page_data(1), block=True)
    a.flush()
    assert b.contains(page_hash(1)) and b.num_pages == 1
    page_files(root)[0].unlink()  # another replica evicted it
    assert b.read(page_hash(1)) is None and b.num_pages == 0 and b.used_bytes == 0
    b.make_room(1 << 40)  # evicting past a file that is gone: no error
    a.make_room(1 << 40)
    assert a.num_pages == 0 and a.stats["disk_pages_evicted"] == 0


def test_a_corrupt_page_is_a_counted_miss_and_is_removed(tmp_path):
    root = tmp_path / "kv"
    a = open_store(root)
    for i in (1, 2):
        a.write(page_hash(i), page_data(i), block=True)
    a.flush()
    files = {f.name[:64]: f for f in page_files(root)}
    flipped, torn = files[page_hash(1).hex()], files[page_hash(2).hex()]
    raw = bytearray(flipped.read_bytes())
    raw[200] ^= 0x5A  # in the payload: only the checksum can tell
    flipped.write_bytes(bytes(raw))
    torn.write_bytes(torn.read_bytes()[:100])
    b = open_store(root)
    assert b.read(page_hash(1)) is None and b.read(page_hash(2)) is None
    assert b.stats["disk_corrupt_pages"] == 2 and b.stats["disk_pages_read"] == 0
    assert not flipped.exists() and not torn.exists()
    assert not b.contains(page_hash(1))


def test_a_good_copy_renamed_over_a_corrupt_page_is_kept(tmp_path):
    root = tmp_path / "kv"
    a = open_store(root)
    a.write(page_hash(1), page_data(1), block=True)
    a.flush()
    path = page_files(root)[0]
    old_inode = path.stat().st_ino
    path.write_bytes(path.read_bytes()[:100])  # torn (same inode)
    fixed = a.write_page_file(page_hash(1), page_data(1))  # another writer's copy lands: a new inode
    assert fixed and path.stat().st_ino != old_inode
    a.discard_corrupt(page_hash(1), "torn", old_inode)  # the reader that saw the torn file
    assert path.exists() and torch.equal(open_store(root).read(page_hash(1)), page_data(1))


def test_temp_files_of_live_writers_are_kept_and_abandoned_ones_removed(tmp_path):
    root = tmp_path / "kv"
    folder = open_store(root).dir
    dead = SPAWN.Process(target=os.getpid)
    dead.start()
    dead.join()
    mine = folder / temp_name("aaaa")  # a live writer on this host (this process)
    gone = folder / temp_name("bbbb").replace(f".{os.getpid()}.", f".{dead.pid}.", 1)
    remote = folder / ".cccc.otherhost.12345.0123abcd.tmp"  # another machine's writer, busy now
    remote_old = folder / ".dddd.otherhost.12345.0123abcd.tmp"
    for f in (mine, gone, remote, remote_old):
        f.write_bytes(b"partial page")
    past = time.time() - STALE_TEMP_S - 60
    os.utime(remote_old, (past, past))
    store = open_store(root)
    assert mine.exists() and remote.exists()
    assert not gone.exists() and not remote_old.exists()
    assert store.stats["disk_temps_removed"] == 2


def test_a_page_of_another_format_version_is_a_miss_left_in_place(tmp_path):
    import struct

    root = tmp_path / "kv"
    a = open_store(root)
    a.write(page_hash(1), page_data(1), block=True)
    a.flush()
    path = page_files(root)[0]
    raw = bytearray(path.read_bytes())
    struct.pack_into("<H", raw, 4, 99)  # the header's format version: a later Jumpgate's page
    path.write_bytes(bytes(raw))
    b = open_store(root)
    assert b.read(page_hash(1)) is None
    assert b.stats["disk_foreign_pages"] == 1 and b.stats["disk_corrupt_pages"] == 0
    assert path.read_bytes() == bytes(raw)  # kept, unchanged


def test_another_models_pages_are_never_read_or_evicted(tmp_path):
    root = tmp_path / "kv"
    a = open_store(root)
    for i in (1, 2):
        a.write(page_hash(i), page_data(i), block=True)
    a.flush()
    theirs = {f: f.read_bytes() for f in page_files(root)}
    b = open_store(root, max_bytes=1, identity="cd" * 32)  # another model, a budget of nothing
    assert b.num_pages == 0 and not b.contains(page_hash(1))
    b.write(page_hash(3), page_data(3), block=True)
    b.flush()
    assert {f: f.read_bytes() for f in theirs} == theirs


def test_the_model_identity_follows_the_page_format_version(tiny_model_dir, monkeypatch):
    from runtime.kvcache.tiers import disk_store

    identity = disk_store.model_identity(tiny_model_dir, torch.float32, 2, 2, 16)
    monkeypatch.setattr(disk_store, "VERSION", disk_store.VERSION + 1)
    assert disk_store.model_identity(tiny_model_dir, torch.float32, 2, 2, 16) != identity


# ------------------------------------------------------------------------------ two engines


SYSTEM = "You are the shared agent of a travel agency; answer briefly. " * 5
GREEDY = SamplingParams(max_new_tokens=10, temperature=0.0, ignore_eos=True)


def engine_config(model_dir, disk_dir, **extra) -> dict:
    cfg = dict(
        model=str(model_dir),
        kv_pool_tokens=512,
        host_pool_tokens=1024,
        disk_cache_dir=str(disk_dir),
        hicache_page_tokens=16,
        hicache_min_load_tokens=16,
        debug_invariants=True,
    )
    cfg.update(extra)
    return cfg


def serve_in_another_process(cfg, prompts, out):
    """Replica A: serves the prompts (write-through puts their pages on disk), then exits."""
    with Engine(**cfg) as engine:
        results = engine.generate_many([GenerateRequest(p, GREEDY) for p in prompts], timeout=300)
    out.put([r.token_ids for r in results])


def test_an_engine_loads_the_prefix_another_engine_process_wrote(tiny_model_dir, tokenizer, tmp_path):
    prompts = [chat_ids(tokenizer, q, system=SYSTEM) for q in ("Rome in May?", "Oslo in June?")]
    disk = tmp_path / "shared-kv"
    with Engine(model=str(tiny_model_dir), radix_cache=False, kv_pool_tokens=1024) as plain:
        recomputed = [
            r.token_ids for r in plain.generate_many([GenerateRequest(p, GREEDY) for p in prompts], timeout=300)
        ]
    with Engine(**engine_config(tiny_model_dir, disk)) as b:  # replica B: started on an empty folder
        assert b.explain_prefix(prompts[0]).cached_tokens == 0
        out = SPAWN.Queue()
        a = SPAWN.Process(target=serve_in_another_process, args=(engine_config(tiny_model_dir, disk), prompts[:1], out))
        a.start()
        from_a = out.get(timeout=300)
        a.join(timeout=60)
        assert a.exitcode == 0
        assert from_a == recomputed[:1]

        info = b.explain_prefix(prompts[0])
        assert info.by_tier["disk"] >= 64 and info.by_tier["device"] == 0  # A's pages, found by key
        got = [b.generate_many([GenerateRequest(p, GREEDY)], timeout=300)[0] for p in prompts]
        other_tenant = b.generate_many([GenerateRequest(prompts[0], GREEDY, namespace="tenant-b")], timeout=300)[0]
        stats = b.stats()
    assert [r.token_ids for r in got] == recomputed  # loaded KV gives the recompute's outputs
    assert got[0].cached_tokens == info.by_tier["disk"]
    assert stats.tier_counters["hicache_loaded_disk_tokens"] == got[0].cached_tokens  # B computed only the tail
    assert stats.tier_counters["disk_pages_adopted"] > 0
    assert other_tenant.cached_tokens == 0 and other_tenant.token_ids == recomputed[0]
