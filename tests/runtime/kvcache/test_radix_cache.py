"""Radix prefix cache: unit tests and a brute-force model checked by hypothesis."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.kvcache.lru_queue import LRUQueue
from runtime.kvcache.pool import SlotAllocator
from runtime.kvcache.prefix_cache import NoPrefixCache
from runtime.kvcache.radix_cache import RadixCache, common_len


def make(num_slots: int = 64, page_size: int = 1) -> RadixCache:
    return RadixCache(SlotAllocator(num_slots), page_size=page_size)


def put(cache: RadixCache, key, namespace: str = "") -> torch.Tensor:
    """Insert `key` with fresh slots, freeing duplicates and the partial page as the caller must."""
    slots = cache.allocator.alloc(len(key))
    cached = cache.insert(key, slots, namespace).cached_len
    aligned = len(key) // cache.page_size * cache.page_size
    cache.allocator.free(slots[:cached])
    cache.allocator.free(slots[aligned:])
    return slots


def test_match_splits_node_and_returns_inserted_slots():
    c = make()
    slots = put(c, [1, 2, 3, 4])
    m = c.match_prefix([1, 2, 9])
    assert m.length == 2 and m.slots.tolist() == slots[:2].tolist()
    assert m.node.key == (1, 2) and len(m.node.children) == 1  # split at the mismatch
    assert c.match_prefix([1, 2, 3, 4, 5]).slots.tolist() == slots.tolist()
    dup = c.allocator.alloc(3)
    assert c.insert([1, 2, 5], dup).cached_len == 2
    c.allocator.free(dup[:2])
    c.check_invariant()


def test_insert_returns_cached_length_and_caller_frees_duplicates():
    c = make(16)
    first = put(c, [5, 6, 7])
    second = c.allocator.alloc(4)
    assert c.insert([5, 6, 7, 8], second).cached_len == 3
    c.allocator.free(second[:3])
    c.check_invariant()
    assert c.total_size == 4 and c.allocator.num_free == 12
    assert c.match_prefix([5, 6, 7, 8]).slots.tolist() == first.tolist() + [second[3].item()]


def test_prefix_match_length_does_not_mutate():
    c = make()
    put(c, [1, 2, 3, 4])
    root_child = next(iter(c.root("").children.values()))
    t = root_child.last_access
    assert c.prefix_match_length([1, 2, 9]) == 2
    assert c.prefix_match_length([1, 2, 3, 4, 5]) == 4
    assert root_child.key == (1, 2, 3, 4) and root_child.last_access == t  # no split, no touch
    assert c.prefix_match_length([7]) == 0 and c.prefix_match_length([1], "other") == 0


def test_lock_protects_from_eviction_and_sizes_track():
    c = make(32)
    put(c, [1, 2, 3, 4])
    put(c, [1, 2, 5, 6])
    put(c, [9, 9])
    m = c.match_prefix([1, 2, 3, 4])
    c.lock(m.node)
    assert c.protected_size == 4 and c.evictable_size == 4
    assert c.evict(100) == 4  # [5, 6] and [9, 9]; [1, 2, 3, 4] is pinned
    assert c.prefix_match_length([1, 2, 3, 4]) == 4 and c.prefix_match_length([9]) == 0
    c.check_invariant()
    c.unlock(m.node)
    assert c.protected_size == 0 and c.evictable_size == 4
    assert c.evict(1) == 2 and c.evict(1) == 2  # leaf [3, 4] first, then parent [1, 2]
    assert c.total_size == 0 and c.allocator.num_free == 32 and c.evicted_tokens == 8
    with pytest.raises(RuntimeError):
        c.unlock(m.node)
    with pytest.raises(RuntimeError):
        c.lock(m.node)  # evicted handle


def test_nested_locks_count():
    c = make()
    put(c, [1, 2, 3])
    a = c.match_prefix([1, 2, 3]).node
    b = c.match_prefix([1, 2]).node  # splits the node that `a` pins
    c.lock(a)
    c.lock(b)
    c.unlock(a)
    assert c.protected_size == 2 and c.evict(10) == 1  # only [3] goes
    c.unlock(b)
    c.check_invariant()
    assert c.evict(10) == 2


def test_evict_lru_order():
    c = make()
    put(c, [1, 1])
    put(c, [2, 2])
    put(c, [3, 3])
    c.match_prefix([1, 1])  # touch: [2, 2] is now the oldest
    assert c.evict(1) == 2
    assert c.prefix_match_length([2, 2]) == 0
    assert c.prefix_match_length([1, 1]) == 2 and c.prefix_match_length([3, 3]) == 2
    assert c.evict(1) == 2 and c.prefix_match_length([3, 3]) == 0
    c.check_invariant()


def test_insert_returns_the_node_of_the_inserted_path():
    c = make()
    first = c.insert([1, 2, 3], c.allocator.alloc(3))
    assert first.cached_len == 0 and first.node.key == (1, 2, 3)
    again = c.allocator.alloc(3)
    second = c.insert([1, 2, 3], again)
    assert second.node is first.node and second.cached_len == 3
    c.allocator.free(again)
    longer = c.insert([1, 2, 3, 4, 5], c.allocator.alloc(5))
    assert longer.node.key == (4, 5) and longer.node.parent is first.node and longer.cached_len == 3
    c.lock(longer.node)  # a handle like a match's: locks its path
    assert c.protected_size == 5
    c.unlock(longer.node)


def test_eviction_is_lru_among_unlocked_leaves_without_a_tree_scan(monkeypatch):
    c = make(4096)
    for i in range(400):  # 400 leaves under a shared stem, inserted in order: oldest first
        put(c, [0, 0, i + 1, i + 1])
    pinned = c.match_prefix([0, 0, 1, 1]).node  # oldest leaf, touched and locked
    c.lock(pinned)
    c.match_prefix([0, 0, 3, 3])  # touched: now the most recent unlocked leaf

    def no_scan():
        raise AssertionError("eviction scanned the whole tree")

    monkeypatch.setattr(c, "nodes", no_scan)
    before = c.lru.visited
    assert c.evict(4) == 4  # leaves are 2 tokens each: the two least recently used go
    assert c.lru.visited - before < 20  # a few heap entries, not 400 leaves
    gone = [i for i in range(1, 401) if c.prefix_match_length([0, 0, i, i]) == 2]
    assert gone == [2, 4]  # 1 is locked, 3 was touched
    assert c.evict(2 * 397) == 2 * 397
    assert [i for i in range(1, 401) if c.prefix_match_length([0, 0, i, i]) == 4] == [1]
    monkeypatch.undo()
    c.unlock(pinned)
    c.check_invariant()


class _Item:
    def __init__(self, ident: int, t: int):
        self.id, self.last_access, self.ok = ident, t, True


def test_lru_queue_rekeys_touched_entries_and_skips_non_candidates():
    q = LRUQueue(lambda item: item.ok)
    a, b, c = _Item(1, 1), _Item(2, 2), _Item(3, 3)
    for item in (a, b, c, a):
        q.push(item)
    assert len(q) == 3  # one entry per item
    a.last_access = 10  # touched after it was queued
    b.ok = False  # e.g. locked meanwhile
    assert q.pop() is c and b not in q  # b dropped until pushed again, a re-keyed
    b.ok = True
    q.push(b)
    assert q.pop() is b and q.pop() is a and q.pop() is None


def test_evict_frees_through_allocator():
    alloc = SlotAllocator(8)
    c = RadixCache(alloc)
    slots = alloc.alloc(8)
    c.insert(list(range(8)), slots)
    assert alloc.alloc(1) is None
    assert c.evict(3) == 8 and alloc.num_free == 8
    assert sorted(alloc.alloc(8).tolist()) == sorted(slots.tolist())


@pytest.mark.parametrize("page_size", [2, 4])
def test_pages_only_whole_pages(page_size):
    c = make(64, page_size)
    key = list(range(1, 2 * page_size + 2))  # two pages and a partial one
    slots = put(c, key)
    assert c.total_size == 2 * page_size
    assert c.match_prefix(key).length == 2 * page_size
    c.check_invariant()
    # a mismatch inside the second page matches the first page only
    probe = key[: page_size + 1] + [0] * page_size
    m = c.match_prefix(probe)
    assert m.length == page_size and m.slots.tolist() == slots[:page_size].tolist()
    assert c.prefix_match_length(key[: page_size - 1]) == 0
    # a mismatch inside the first page matches nothing
    assert c.prefix_match_length([1] + [0] * (2 * page_size)) == 0
    put(c, probe)
    assert c.match_prefix(probe).length == 2 * page_size
    assert c.total_size == 3 * page_size
    c.check_invariant()  # also checks every node holds whole pages


def test_namespaces_isolate():
    c = make()
    put(c, [1, 2, 3], namespace="tenant-a")
    assert c.prefix_match_length([1, 2, 3]) == 0
    assert c.prefix_match_length([1, 2, 3], "tenant-b") == 0
    m = c.match_prefix([1, 2, 3], "tenant-b")
    assert m.length == 0
    c.lock(m.node)
    c.unlock(m.node)
    assert c.match_prefix([1, 2, 3], "tenant-a").length == 3
    assert c.insert([1, 2, 3], c.allocator.alloc(3)).cached_len == 0  # default namespace owns its own copy
    assert c.total_size == 6
    assert c.evict(6) == 6 and c.namespaces == [""]  # empty tenant roots are dropped
    c.check_invariant()


def test_reset_and_cache_finished():
    c = make(16, page_size=2)
    put(c, [1, 2, 3, 4])
    m = c.match_prefix([1, 2, 3, 4, 5, 6, 7])
    c.lock(m.node)
    new = c.allocator.alloc(3)
    slots = torch.cat([m.slots, new])
    c.check_invariant(running_only_slots=3)
    with pytest.raises(RuntimeError):
        c.reset()
    assert c.cache_finished([1, 2, 3, 4, 5, 6, 7], slots, m.node, m.length) == 4
    assert c.total_size == 6 and c.protected_size == 0  # token 7 was a partial page: freed
    c.check_invariant()
    c.reset()
    assert c.total_size == 0 and c.allocator.num_free == 16
    c.check_invariant()


def test_no_prefix_cache_frees_everything_on_finish():
    alloc = SlotAllocator(8)
    c = NoPrefixCache(alloc)
    m = c.match_prefix([1, 2, 3])
    assert m.length == 0 and m.slots.numel() == 0
    c.lock(m.node)
    slots = alloc.alloc(3)
    c.check_invariant(running_only_slots=3)
    assert c.cache_finished([1, 2, 3], slots, m.node, m.length) == 3
    assert alloc.num_free == 8 and c.total_size == 0 and c.evict(5) == 0
    c.check_invariant()


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 1), max_size=300), st.lists(st.integers(0, 1), max_size=300))
def test_common_len_matches_naive(a, b):
    naive = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    shared = a[:150] + b  # long shared runs exercise the chunked compare
    assert common_len(tuple(a), tuple(b)) == naive
    assert common_len(tuple(a), tuple(shared)) == len(a[:150]) + next(
        (i for i, (x, y) in enumerate(zip(a[150:], b)) if x != y), min(len(a[150:]), len(b))
    )


def test_long_keys_across_many_branches():
    c = make(20_000)
    base = list(range(2000))
    slots = put(c, base)
    for i in range(1, 20):  # branches along the way so the walk crosses many nodes
        put(c, base[: 100 * i] + [-1 - i] * 10)
    probe = base[:1999] + [-5]
    total = c.total_size
    m = c.match_prefix(base)
    assert m.length == 2000 and torch.equal(m.slots, slots)
    assert len(c.walk(base, "", split=False).path) == 20  # split at every branch point
    assert c.prefix_match_length(probe) == 1999
    assert c.insert(base, torch.zeros(2000, dtype=torch.int64)).cached_len == 2000  # fully cached
    assert c.total_size == total  # took nothing
    c.check_invariant()


# -- property test against a brute-force model -----------------------------------------------

NAMESPACES = ["", "t1"]
# keys from a small alphabet, often extending shared bases, so prefixes overlap and nodes split
BASES = [(0, 1, 2, 0, 1, 2, 0, 1), (0, 1, 2, 2), (1, 1, 1, 1, 1, 1)]
tails = st.lists(st.integers(0, 2), max_size=6)
keys = st.one_of(
    st.lists(st.integers(0, 2), max_size=12),
    st.builds(lambda base, cut, tail: list(base[:cut]) + tail, st.sampled_from(BASES), st.integers(0, 8), tails),
)
ops = st.lists(
    st.one_of(
        st.tuples(st.just("insert"), st.sampled_from(NAMESPACES), keys),
        st.tuples(st.just("start"), st.sampled_from(NAMESPACES), keys),
        st.tuples(st.just("finish"), st.integers(0, 7)),
        st.tuples(st.just("match"), st.sampled_from(NAMESPACES), keys),
        st.tuples(st.just("evict"), st.integers(0, 20)),
    ),
    min_size=8,
    max_size=40,
)


class Model:
    """Per namespace: cached whole-page prefix (tuple) -> slots of its last page."""

    def __init__(self, page_size: int):
        self.page = page_size
        self.cached: dict[str, dict[tuple, list[int]]] = {ns: {} for ns in NAMESPACES}

    def longest(self, ns: str, key) -> int:
        n = 0
        while n + self.page <= len(key) and tuple(key[: n + self.page]) in self.cached[ns]:
            n += self.page
        return n

    def slots(self, ns: str, key, n: int) -> list[int]:
        return [s for j in range(self.page, n + 1, self.page) for s in self.cached[ns][tuple(key[:j])]]

    def insert(self, ns: str, key, slots: torch.Tensor) -> None:
        for j in range(self.page, len(key) + 1, self.page):  # first insert of a page wins
            self.cached[ns].setdefault(tuple(key[:j]), slots[j - self.page : j].tolist())

    def sync_after_evict(self, c: RadixCache, freed: int) -> None:
        """Eviction drops tree suffixes; mirror it through the read-only length query."""
        removed = 0
        for ns, d in self.cached.items():
            for p in list(d):
                if c.prefix_match_length(p, ns) < len(p):
                    del d[p]
                    removed += self.page
        assert removed == freed


def check_slot_partition(c: RadixCache, model: Model, running: list) -> None:
    """Free list, tree slots and running-only slots partition the pool exactly."""
    a = c.allocator
    free = a.free_slots()
    tree = [s for d in model.cached.values() for page in d.values() for s in page]
    mine = [s for r in running for s in r["new"].tolist()]
    assert sorted(free + tree + mine) == list(range(a.num_slots))


@settings(max_examples=200, deadline=None)
@given(page_size=st.sampled_from([1, 2, 4]), num_slots=st.integers(8, 40), program=ops)
def test_against_brute_force_model(page_size, num_slots, program):
    c = RadixCache(SlotAllocator(num_slots), page_size=page_size)
    model = Model(page_size)
    running: list[dict] = []  # requests holding a lock and their own new slots

    def alloc(n: int):
        """Allocate, evicting if needed, and keep the model in step with any eviction."""
        before = c.evicted_tokens
        slots = c.allocator.alloc(n)
        if slots is None:
            c.evict(n - c.allocator.num_free)
            slots = c.allocator.alloc(n)
        model.sync_after_evict(c, c.evicted_tokens - before)
        return slots

    for op in program:
        if op[0] in ("insert", "match", "start"):
            _, ns, key = op
            expect = model.longest(ns, key)
            assert c.prefix_match_length(key, ns) == expect
        if op[0] == "insert":
            slots = alloc(len(key))
            if slots is None:
                continue
            expect = model.longest(ns, key)  # the allocation may have evicted
            assert c.insert(key, slots, ns).cached_len == expect
            model.insert(ns, key, slots)
            c.allocator.free(slots[:expect])
            c.allocator.free(slots[len(key) // page_size * page_size :])
        elif op[0] in ("match", "start"):
            m = c.match_prefix(key, ns)
            assert m.length == expect and m.slots.tolist() == model.slots(ns, key, expect)
            if op[0] == "start":
                c.lock(m.node)
                new = alloc(len(key) - m.length)
                assert c.prefix_match_length(key, ns) >= m.length  # its lock kept the match
                if new is None:
                    c.unlock(m.node)
                    continue
                running.append(
                    dict(ns=ns, key=key, node=m.node, matched=m.length, slots=torch.cat([m.slots, new]), new=new)
                )
        elif op[0] == "finish" and running:
            r = running.pop(op[1] % len(running))
            expect = model.longest(r["ns"], r["key"])
            assert c.cache_finished(r["key"], r["slots"], r["node"], r["matched"], r["ns"]) == expect
            model.insert(r["ns"], r["key"], r["slots"])
        elif op[0] == "evict":
            evictable = c.evictable_size
            freed = c.evict(op[1])
            assert freed >= min(op[1], evictable) and c.evictable_size == evictable - freed
            model.sync_after_evict(c, freed)
        for r in running:  # locked paths are never evicted
            assert c.prefix_match_length(r["key"], r["ns"]) >= r["matched"]
        pinned = {
            (r["ns"], tuple(r["key"][:j])) for r in running for j in range(page_size, r["matched"] + 1, page_size)
        }
        assert c.protected_size == page_size * len(pinned)
        c.check_invariant(running_only_slots=sum(r["new"].numel() for r in running))
        check_slot_partition(c, model, running)

    for r in running:
        c.unlock(r["node"])
        c.allocator.free(r["new"])
    c.evict(num_slots)
    assert c.total_size == 0 and c.allocator.num_free == num_slots
