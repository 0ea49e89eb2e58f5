"""Hierarchical radix cache: the device KV pool (L1) backed by a host pool (L2) and a disk store (L3).

Anchors: SGLang `mem_cache/hiradix_cache.py` and the HiCache design. The engine sees the
`BasePrefixCache` contract of `prefix_cache.py` unchanged; the tiers live behind it.

Which tiers hold a node:
* `node.value` are its device slots, or None when it is not in L1; `node.host_value` its host slots
  or None. A node in the tree is in L1, in L2 or in both. L1 residency is prefix-closed: a node in
  L1 has its parent in L1, so the L1 part of any match is a prefix of it.
* L3 is not tracked per node: a page is on disk when its file exists (`disk_store.py`). Pages are
  `page_size` tokens, the tree's own page size, so every node is a whole number of disk pages.

Movement between tiers:
* L1 eviction (`evict`) demotes: an unlocked node without children in L1 gets its K/V copied into
  host slots (unless it already has a host copy), then its device slots go back to the allocator.
  The node keeps its key and host slots.
* L2 eviction (when host slots run out) writes the pages of a node that is only in L2 and has no
  children to disk (those not there yet) and removes it from the tree; a node that is also in L1
  just drops its host copy.
* Write policy for copies made ahead of eviction: `write_through` copies a node to L2 (and L3) when
  it is inserted, `write_through_selective` once it has been matched twice, `write_back` only on
  eviction. `close()` writes what is not on disk yet, so a restart is warm under every policy.
* `match_prefix` promotes: after walking the tree (L1 part, then L2 part) and the disk pages that
  follow, it loads the lower-tier part into L1 (allocating device slots, evicting unlocked nodes if
  needed, never more than the allocator's free + evictable slots) and returns only L1 slots, so the
  engine uses the result as with the plain radix cache. A lower-tier part shorter than
  `min_load_tokens` is not loaded (recomputing it is cheaper).
* L3 reads run ahead: `prefetch(key)` (called when a request is queued) starts reading the disk
  pages that follow the key's tree match on a reader pool; `loading(key)` tells the engine whether
  those reads are still in flight, so it admits other requests meanwhile and this one once its
  pages are in memory. `match_prefix` takes the read pages (waiting for a read still in flight, or
  reading synchronously a page nobody prefetched) and copies them into L1 slots.

Accounting, checked by `check_invariant`:
  L1: allocator free + L1 tree slots + request-only slots == device pool size
  L2: host allocator free + host slots held by nodes == host pool size
"""

from __future__ import annotations

import heapq
import logging
from collections import OrderedDict
from concurrent.futures import Future
from typing import Any, Sequence

import torch

from runtime.disk_store import DiskStore, chain_hash, chain_seed, model_identity
from runtime.host_pool import HostKVPool, copy_kv, gather_kv, scatter_kv
from runtime.kv_pool import KVPool
from runtime.prefix_cache import MatchResult
from runtime.radix_cache import RadixCache, TreeNode, _as_key, _common_len

log = logging.getLogger("jumpgate.hicache")

WRITE_POLICIES = ("write_through", "write_through_selective", "write_back")
SELECTIVE_HITS = 2  # write_through_selective: copy a node down after this many matches
_EMPTY_SLOTS = torch.empty(0, dtype=torch.int64)


class HiTreeNode(TreeNode):
    __slots__ = ("host_value", "hits", "hashes")

    def __init__(self, key: tuple = (), value: torch.Tensor | None = None, parent: HiTreeNode | None = None,
                 namespace: str | None = None):
        super().__init__(key, _EMPTY_SLOTS, parent, namespace)
        self.value = value  # device slots; None = not in L1
        self.host_value: torch.Tensor | None = None  # host slots; None = not in L2
        self.hits = 0
        self.hashes: list[bytes] | None = None  # disk page hashes of this node's pages (lazy)

    def __repr__(self) -> str:
        tiers = ("L1" if self.value is not None else "") + ("L2" if self.host_value is not None else "")
        return f"HiTreeNode(id={self.id}, len={len(self.key)}, {tiers or '-'}, lock={self.lock_ref})"


class HiRadixCache(RadixCache):
    def __init__(self, kv: KVPool, host: HostKVPool, page_size: int, disk: DiskStore | None = None,
                 write_policy: str = "write_through", min_load_tokens: int = 32, identity: str = "",
                 max_staged_pages: int = 256):
        if write_policy not in WRITE_POLICIES:
            raise ValueError(f"hicache_write_policy: must be one of {', '.join(WRITE_POLICIES)}")
        self.kv = kv
        self.host = host
        self.disk = disk
        self.write_policy = write_policy
        self.min_load_tokens = min_load_tokens
        self.identity = disk.identity if disk is not None else identity
        self.max_staged_pages = max_staged_pages
        self._busy: set[HiTreeNode] = set()  # L2 nodes being loaded: host eviction skips them
        self._staged: OrderedDict[bytes, Future] = OrderedDict()  # prefetched disk reads by page hash
        self._just_inserted: tuple | None = None
        self._closed = False
        self.tier_counters = {"hicache_demoted_tokens": 0, "hicache_host_evicted_tokens": 0,
                              "hicache_loaded_host_tokens": 0, "hicache_loaded_disk_tokens": 0,
                              "hicache_prefetched_pages": 0, "hicache_backed_up_tokens": 0,
                              "hicache_dropped_tokens": 0}
        super().__init__(kv.allocator, page_size)

    # -- tree plumbing ------------------------------------------------------------------------

    def _init_tree(self) -> None:
        super()._init_tree()
        self._roots = {"": self._new_root("")}

    def _new_root(self, namespace: str) -> HiTreeNode:
        root = HiTreeNode(namespace=namespace)
        root.value = _EMPTY_SLOTS
        root.hashes = [chain_seed(self.identity, self.page_size, namespace)]
        return root

    def _root(self, namespace: str, create: bool) -> HiTreeNode | None:
        root = self._roots.get(namespace)
        if root is None and create:
            root = self._roots[namespace] = self._new_root(namespace)
        return root

    def _split(self, child: HiTreeNode, n: int) -> HiTreeNode:
        mid = HiTreeNode(child.key[:n], None, child.parent)
        if child.value is not None:
            mid.value, child.value = child.value[:n], child.value[n:]
        if child.host_value is not None:
            mid.host_value, child.host_value = child.host_value[:n], child.host_value[n:]
        if child.hashes is not None:
            p = n // self.page_size
            mid.hashes, child.hashes = child.hashes[:p], child.hashes[p:]
        mid.lock_ref, mid.last_access, mid.hits = child.lock_ref, child.last_access, child.hits
        mid.children[self._child_key(child.key, n)] = child
        child.parent.children[self._child_key(child.key)] = mid
        child.key, child.parent = child.key[n:], mid
        return mid

    def _walk_path(self, key: tuple, namespace: str, split: bool, touch: int):
        """Follow `key` from the namespace root: (root, [(node, tokens used)], matched length).
        Without `split` the last node may be used only partly."""
        node = root = self._roots.get(namespace)
        if root is None:
            return None, [], 0
        end = self._aligned(len(key))
        i, path = 0, []
        while i < end:
            child = node.children.get(self._child_key(key, i))
            if child is None:
                break
            n = self._aligned(_common_len(child.key, key[i:i + len(child.key)]))
            if n < len(child.key):
                if not split:
                    path.append((child, n))
                    i += n
                    break
                child = self._split(child, n)
            if touch:
                child.last_access = touch
            path.append((child, n))
            node, i = child, i + n
        return root, path, i

    def _remove(self, node: HiTreeNode) -> None:
        """Unlink a childless node that holds no slots any more."""
        parent = node.parent
        del parent.children[self._child_key(node.key)]
        node.evicted = True
        if parent.parent is None and not parent.children and parent.namespace:
            self._roots.pop(parent.namespace, None)  # empty tenant root: don't let namespaces pile up

    def _hashes(self, node: HiTreeNode) -> list[bytes]:
        """Disk page hashes of `node`'s pages (computed once, from the parent's last hash)."""
        if node.hashes is None:
            prev = self._hashes(node.parent)[-1]
            out = []
            for i in range(0, len(node.key), self.page_size):
                prev = chain_hash(prev, node.key[i:i + self.page_size])
                out.append(prev)
            node.hashes = out
        return node.hashes

    def _disk_pages(self, key: tuple, namespace: str, start: int) -> list[bytes]:
        """Hashes of the consecutive pages of `key` from `start` on that are on disk."""
        end = self._aligned(len(key))
        if self.disk is None or start >= end:
            return []
        prev = chain_seed(self.identity, self.page_size, namespace)
        for i in range(0, start, self.page_size):
            prev = chain_hash(prev, key[i:i + self.page_size])
        out = []
        for i in range(start, end, self.page_size):
            prev = chain_hash(prev, key[i:i + self.page_size])
            if not self.disk.contains(prev):
                break
            out.append(prev)
        return out

    # -- copies between tiers -----------------------------------------------------------------

    def _alloc_host(self, n: int) -> torch.Tensor | None:
        a = self.host.allocator
        if a.num_free < n:
            self._evict_host(n - a.num_free)
        return a.alloc(n)

    def _backup(self, node: HiTreeNode) -> bool:
        """Copy an L1 node's K/V into host slots (it stays in L1)."""
        if node.host_value is not None:
            return True
        slots = self._alloc_host(len(node.key))
        if slots is None:
            return False
        copy_kv(self.kv, node.value, self.host, slots)
        node.host_value = slots
        self.tier_counters["hicache_backed_up_tokens"] += len(node.key)
        return True

    def _write_to_disk(self, node: HiTreeNode, block: bool = False) -> None:
        """Queue the node's pages that are not on disk yet (data from L2 if there, else L1)."""
        if self.disk is None:
            return
        hashes = self._hashes(node)
        missing = [i for i, h in enumerate(hashes) if not self.disk.contains(h)]
        if not missing:
            return
        src, slots = (self.host, node.host_value) if node.host_value is not None else (self.kv, node.value)
        p = self.page_size
        idx = torch.cat([slots[i * p:(i + 1) * p] for i in missing])
        data = gather_kv(src, idx)
        for j, i in enumerate(missing):
            self.disk.write(hashes[i], data[:, :, j * p:(j + 1) * p], block=block)

    def _persist(self, node: HiTreeNode) -> None:
        """Write-through: copy an L1 node to L2 (best effort) and L3."""
        self._backup(node)
        self._write_to_disk(node)

    # -- public API -------------------------------------------------------------------------

    def match_prefix(self, key: Sequence[int], namespace: str = "") -> MatchResult:
        key = _as_key(key)
        counted = self._just_inserted != (namespace, key)  # an engine re-match of its own insert is no hit
        self._just_inserted = None
        tick = next(self._clock)
        root, path, length = self._walk_path(key, namespace, split=True, touch=tick)
        disk_pages = self._disk_pages(key, namespace, length)
        if root is None:
            if not disk_pages:  # unknown namespace: a detached root is a valid handle (locks are no-ops)
                return MatchResult(_EMPTY_SLOTS, HiTreeNode(namespace=namespace), 0)
            root = self._root(namespace, create=True)
        nodes = [node for node, _ in path]
        on_device = [node for node in nodes if node.value is not None]
        lower = nodes[len(on_device):]
        if lower or disk_pages:
            on_device += self._load_back(root, on_device, lower, disk_pages, key, length, tick)
        if not root.children and root.namespace:  # created for disk pages that did not load
            self._roots.pop(root.namespace, None)
        if counted:
            for node in nodes:
                node.hits += 1
            if self.write_policy == "write_through_selective":
                # after the load: copying down may evict L2 nodes, and `lower` had to stay put
                for node in on_device:
                    if node.hits == SELECTIVE_HITS:
                        self._persist(node)
        values = [node.value for node in on_device]
        slots = torch.cat(values) if len(values) > 1 else (values[0] if values else _EMPTY_SLOTS)
        return MatchResult(slots, on_device[-1] if on_device else root, slots.numel())

    def _load_back(self, root: HiTreeNode, on_device: list[HiTreeNode], lower: list[HiTreeNode],
                   disk_pages: list[bytes], key: tuple, tree_len: int, tick: int) -> list[HiTreeNode]:
        """Promote the L2 nodes `lower`, then the disk pages after them, into L1 (in that order,
        as much as the allocator's free + evictable slots allow). Returns the nodes now in L1."""
        p = self.page_size
        host_len = sum(len(n.key) for n in lower)
        if host_len + len(disk_pages) * p < self.min_load_tokens:
            return []
        pages = self._read_pages(disk_pages)
        want = host_len + len(pages) * p
        if want < self.min_load_tokens:
            return []
        handle = on_device[-1] if on_device else root
        self.lock(handle)  # the L1 part of the match must survive the eviction below
        self._busy = set(lower)
        loaded: list[HiTreeNode] = []
        try:
            a = self._allocator
            want = min(want, self._aligned(a.num_free + self._evictable))
            if a.num_free < want:
                self.evict(want - a.num_free)
                # an emptied tenant root leaves `_roots`; the nodes loaded below hang from it again
                self._roots[root.namespace] = root
            want = min(want, self._aligned(a.num_free))
            if want < self.min_load_tokens or want == 0:
                return []
            slots = a.alloc(want)
            pos, parent = 0, handle
            for node in lower:
                if pos >= want:
                    break
                if len(node.key) > want - pos:
                    node = self._split(node, want - pos)
                n = len(node.key)
                node.value = slots[pos:pos + n]
                copy_kv(self.host, node.host_value, self.kv, node.value)
                self._evictable += n
                self.tier_counters["hicache_loaded_host_tokens"] += n
                loaded.append(node)
                pos, parent = pos + n, node
            n_pages = (want - pos) // p
            if n_pages:
                n = n_pages * p
                node = HiTreeNode(key[tree_len:tree_len + n], slots[pos:pos + n], parent)
                scatter_kv(self.kv, node.value, torch.cat(pages[:n_pages], dim=2))
                node.hashes = list(disk_pages[:n_pages])
                node.last_access, node.hits = tick, 1
                parent.children[self._child_key(node.key)] = node
                self._evictable += n
                self.tier_counters["hicache_loaded_disk_tokens"] += n
                loaded.append(node)
            return loaded
        finally:
            self._busy = set()
            self.unlock(handle)

    def _read_pages(self, hashes: list[bytes]) -> list[torch.Tensor]:
        """The pages' KV, stopping at the first one that is missing or corrupt."""
        out = []
        for h in hashes:
            fut = self._staged.pop(h, None)
            try:
                data = fut.result() if fut is not None else self.disk.read(h)
            except Exception:  # a failed read is a miss
                log.exception("disk KV cache: reading a page failed")
                data = None
            if data is None:
                for rest in hashes[len(out) + 1:]:  # pages after a miss are of no use
                    fut = self._staged.pop(rest, None)
                    if fut is not None:
                        fut.cancel()
                break
            out.append(data)
        return out

    def prefix_match_length(self, key: Sequence[int], namespace: str = "") -> int:
        return sum(self.tier_lengths(key, namespace).values())

    def tier_lengths(self, key: Sequence[int], namespace: str = "") -> dict[str, int]:
        """How much of `key` each tier holds (device first, then host, then disk), no mutation."""
        key = _as_key(key)
        _, path, length = self._walk_path(key, namespace, split=False, touch=0)
        device = sum(n for node, n in path if node.value is not None)
        return {"device": device, "host": length - device,
                "disk": len(self._disk_pages(key, namespace, length)) * self.page_size}

    def prefetch(self, key: Sequence[int], namespace: str = "") -> None:
        """Start reading the disk pages that follow `key`'s tree match (a request was queued)."""
        if self.disk is None:
            return
        key = _as_key(key)
        _, _, length = self._walk_path(key, namespace, split=False, touch=0)
        for h in self._disk_pages(key, namespace, length):
            if h not in self._staged:
                self._staged[h] = self.disk.read_async(h)
                self.tier_counters["hicache_prefetched_pages"] += 1
        while len(self._staged) > self.max_staged_pages:  # requests that left before admission
            self._staged.popitem(last=False)[1].cancel()

    def loading(self, key: Sequence[int], namespace: str = "") -> bool:
        """True while a prefetch of `key`'s disk pages is still reading."""
        if not self._staged:
            return False
        key = _as_key(key)
        _, _, length = self._walk_path(key, namespace, split=False, touch=0)
        return any(h in self._staged and not self._staged[h].done()
                   for h in self._disk_pages(key, namespace, length))

    def insert(self, key: Sequence[int], slots: torch.Tensor, namespace: str = "") -> int:
        key = _as_key(key)
        if slots.numel() < len(key):
            raise ValueError(f"{slots.numel()} slots for {len(key)} tokens")
        root = self._root(namespace, create=True)
        tick = next(self._clock)
        _, path, matched = self._walk_path(key, namespace, split=True, touch=tick)
        cached = pos = 0
        for node, n in path:
            if node.value is None:
                # only in L2: adopt the caller's slots (same tokens, same KV), so it is in L1 again
                node.value = slots[pos:pos + n].to(torch.int64).clone()
                self._evictable += n
            else:
                cached = pos + n  # L1 is prefix-closed: the L1 part ends here at the latest
            pos += n
        end = self._aligned(len(key))
        if matched < end:
            parent = path[-1][0] if path else root
            leaf = HiTreeNode(key[matched:end], slots[matched:end].to(torch.int64).clone(), parent)
            leaf.last_access = tick
            parent.children[self._child_key(leaf.key)] = leaf
            self._evictable += end - matched
            if self.write_policy == "write_through":
                self._persist(leaf)
        self._just_inserted = (namespace, key)
        return cached

    def lock(self, node: TreeNode | None) -> None:
        if node is not None and node.parent is not None and node.value is None:
            raise RuntimeError("lock on a node that is not in L1: lock right after match_prefix")
        super().lock(node)

    def evict(self, num_tokens: int) -> int:
        """Free at least `num_tokens` device slots by demoting unlocked L1 leaves to L2 (LRU)."""
        if num_tokens <= 0:
            return 0
        heap = [(n.last_access, n.id, n) for n in self._nodes() if self._l1_evictable(n)]
        heapq.heapify(heap)
        freed = 0
        while freed < num_tokens and heap:
            _, _, node = heapq.heappop(heap)
            if not self._l1_evictable(node):  # changed by a host eviction meanwhile
                continue
            n = len(node.key)
            if node.host_value is None and not self._backup(node):
                # no host room (the pool is smaller than the node, or all of it busy): to disk, if any
                self._write_to_disk(node)
                self._allocator.free(node.value)
                node.value = None
                self._drop_subtree(node)
                self.tier_counters["hicache_dropped_tokens"] += n
            else:
                self._allocator.free(node.value)
                node.value = None
                self.tier_counters["hicache_demoted_tokens"] += n
            self._evictable -= n
            freed += n
            parent = node.parent
            if self._l1_evictable(parent):
                heapq.heappush(heap, (parent.last_access, parent.id, parent))
        self.evicted_tokens += freed
        return freed

    @staticmethod
    def _l1_evictable(node: HiTreeNode) -> bool:
        return (node.parent is not None and not node.evicted and node.value is not None and node.lock_ref == 0
                and not any(c.value is not None for c in node.children.values()))

    def _drop_subtree(self, node: HiTreeNode) -> None:
        """Remove `node` (no longer in L1 or L2) and its L2-only descendants, writing them to disk."""
        stack = list(node.children.values())
        while stack:
            n = stack.pop()
            stack.extend(n.children.values())
            if n.host_value is not None:
                self._write_to_disk(n)
                self.host.allocator.free(n.host_value)
                n.host_value = None
            n.evicted = True
        node.children.clear()
        self._remove(node)

    def _evict_host(self, num_tokens: int) -> int:
        """Free at least `num_tokens` host slots, LRU: a node only in L2 without children goes to
        disk and leaves the tree; a node also in L1 drops its host copy."""
        def candidate(n: HiTreeNode) -> bool:
            return (n.host_value is not None and not n.evicted and n not in self._busy
                    and (n.value is not None or not n.children))

        heap = [(n.last_access, n.id, n) for n in self._nodes() if candidate(n)]
        heapq.heapify(heap)
        freed = 0
        while freed < num_tokens and heap:
            _, _, node = heapq.heappop(heap)
            if not candidate(node):
                continue
            n = len(node.key)
            if node.value is None:
                self._write_to_disk(node)
            self.host.allocator.free(node.host_value)
            node.host_value = None
            freed += n
            if node.value is None:
                parent = node.parent
                self._remove(node)
                if parent.parent is not None and candidate(parent):
                    heapq.heappush(heap, (parent.last_access, parent.id, parent))
        self.tier_counters["hicache_host_evicted_tokens"] += freed
        return freed

    def reset(self) -> None:
        """Drop the whole tree from L1 and L2 (the disk store keeps its pages)."""
        if self._protected:
            raise RuntimeError("reset while requests hold locked prefixes")
        for node in self._nodes():
            if node.value is not None:
                self._allocator.free(node.value)
            if node.host_value is not None:
                self.host.allocator.free(node.host_value)
        for fut in self._staged.values():
            fut.cancel()
        self._staged.clear()
        self._init_tree()

    def close(self) -> None:
        """Write every cached page that is not on disk yet, then wait for the disk writes."""
        if self._closed:
            return
        self._closed = True
        for fut in self._staged.values():
            fut.cancel()
        self._staged.clear()
        if self.disk is None:
            return
        try:
            for node in list(self._nodes()):
                self._write_to_disk(node, block=True)
        finally:
            self.disk.close()

    # -- stats and checks ---------------------------------------------------------------------

    def tier_stats(self) -> dict[str, Any]:
        h = self.host.allocator
        out: dict[str, Any] = dict(self.tier_counters)
        out.update(host_slots_total=h.num_slots, host_slots_free=h.num_free,
                   host_slots_tree=h.num_slots - h.num_free)
        if self.disk is not None:
            out.update(self.disk.stats, disk_pages=self.disk.num_pages, disk_bytes=self.disk.used_bytes)
        return out

    def check_invariant(self, running_only_slots: int = 0) -> None:
        evictable = protected = 0
        values, host_values = [], []
        for node in self._nodes():
            parent = node.parent
            assert len(node.key) > 0 and len(node.key) % self.page_size == 0, node
            assert parent.children.get(self._child_key(node.key)) is node, node
            assert not node.evicted and node not in self._busy, node
            assert node.value is not None or node.host_value is not None, f"{node!r} is in no tier"
            assert 0 <= node.lock_ref <= parent.lock_ref or parent.parent is None, node
            if node.value is not None:
                assert node.value.numel() == len(node.key), node
                assert parent.value is not None, f"{node!r} is in L1 but its parent is not"
                values.append(node.value)
                if node.lock_ref:
                    protected += len(node.key)
                else:
                    evictable += len(node.key)
            else:
                assert node.lock_ref == 0, f"{node!r} is locked but not in L1"
            if node.host_value is not None:
                assert node.host_value.numel() == len(node.key), node
                host_values.append(node.host_value)
        assert (evictable, protected) == (self._evictable, self._protected), \
            ((evictable, protected), (self._evictable, self._protected))
        total = evictable + protected
        if values:
            assert torch.cat(values).unique().numel() == total, "a device slot is held twice"
        a = self._allocator
        assert a.num_free + total + running_only_slots == a.num_slots, \
            f"L1: free {a.num_free} + tree {total} + running {running_only_slots} != {a.num_slots}"
        held = sum(v.numel() for v in host_values)
        if host_values:
            assert torch.cat(host_values).unique().numel() == held, "a host slot is held twice"
        h = self.host.allocator
        assert h.num_free + held == h.num_slots, f"L2: free {h.num_free} + tree {held} != {h.num_slots}"


def build_hiradix_cache(cfg: Any, kv: KVPool, model_dir: Any) -> HiRadixCache:
    """The tiered cache for an engine config (`host_pool_tokens > 0`)."""
    page = cfg.hicache_page_tokens
    if page < 1:
        raise ValueError("hicache_page_tokens must be >= 1")
    if page % cfg.page_size:
        raise ValueError(f"hicache_page_tokens ({page}) must be a multiple of page_size ({cfg.page_size})")
    if cfg.hicache_write_policy not in WRITE_POLICIES:
        raise ValueError(f"hicache_write_policy: must be one of {', '.join(WRITE_POLICIES)}")
    host = HostKVPool.like(kv, cfg.host_pool_tokens)
    identity = model_identity(model_dir, kv.dtype, kv.num_layers, kv.kv_heads, kv.head_dim)
    disk = None
    if cfg.disk_cache_dir:
        disk = DiskStore(cfg.disk_cache_dir, identity, page, kv.num_layers, kv.kv_heads, kv.head_dim,
                         kv.dtype, max_bytes=cfg.disk_cache_bytes)
    staged = max(16, cfg.host_pool_tokens // page)
    return HiRadixCache(kv, host, page, disk, cfg.hicache_write_policy, cfg.hicache_min_load_tokens,
                        identity=identity, max_staged_pages=staged)
