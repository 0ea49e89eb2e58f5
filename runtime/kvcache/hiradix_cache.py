"""Hierarchical radix cache: the device KV pool (L1) backed by a host pool (L2) and a disk store (L3).

Anchors: SGLang `mem_cache/hiradix_cache.py` and the HiCache design. The engine sees the
`BasePrefixCache` contract of `prefix_cache.py`; the tiers live behind it. Built by composition:
the one radix tree (`RadixCache`) holds the nodes and their device slots, `HostTier` their host
copies, `DiskTier` their disk pages; this class holds the policies that move KV between them.

Which tiers hold a node: the tree's `node.value` (device slots, None when not in L1) and its
`TierRecord.host` (host slots or None). A node in the tree is in L1, in L2 or in both; L1
residency is prefix-closed. L3 is not tracked per node: a page is on disk when its file exists.

Movement between tiers:
* L1 eviction (the tree's `evict`) demotes through the tree's `spill` hook: an unlocked L1 leaf
  gets its K/V copied into host slots (unless it has a copy), then its device slots are freed and
  the node stays in the tree. With no host room it goes to disk and leaves the tree.
* L2 eviction (`HostTier.evict`, when host slots run out) writes a node that is only in L2 and has
  no children to disk and removes it from the tree; a node also in L1 just drops its host copy.
* Write policy for copies made ahead of eviction: `write_through` copies a node to L2 (and L3) when
  it is inserted, `write_through_selective` once two admissions used it, `write_back` only on
  eviction. `close()` writes what is not on disk yet, so a restart is warm under every policy.
* `load_back(key)` (called at admission, right before `match_prefix`) promotes the L2 part of the
  key's match and the disk pages that follow into L1 (allocating device slots, evicting unlocked
  nodes if needed, never more than free + evictable). A lower-tier part shorter than
  `min_load_tokens` is not loaded (recomputing it is cheaper). `match_prefix` never loads.
* `prefetch(key)` (a request was queued) starts reading the disk pages after the key's tree match;
  `loading(key)` says whether those reads are still in flight, so the engine admits others first.

Accounting, checked by `check_invariant`:
  L1: allocator free + L1 tree slots + request-only slots == device pool size
  L2: host allocator free + host slots held by nodes == host pool size
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from runtime.kvcache.pool import KVPool, SlotAllocator
from runtime.kvcache.prefix_cache import BasePrefixCache, InsertResult, MatchResult
from runtime.kvcache.radix_cache import RadixCache, TreeNode, as_key, device_length
from runtime.kvcache.tiers.disk_store import DiskStore, model_identity
from runtime.kvcache.tiers.disk_tier import DiskTier
from runtime.kvcache.tiers.host_pool import HostKVPool, scatter_kv
from runtime.kvcache.tiers.host_tier import HostTier
from runtime.kvcache.tiers.tier_record import host_slots, record

WRITE_POLICIES = ("write_through", "write_through_selective", "write_back")
SELECTIVE_HITS = 2  # write_through_selective: copy a node down once this many admissions used it


class HiRadixCache(BasePrefixCache):
    def __init__(
        self,
        kv: KVPool,
        host: HostKVPool,
        page_size: int,
        disk: DiskStore | None = None,
        write_policy: str = "write_through",
        min_load_tokens: int = 32,
        identity: str = "",
        max_staged_pages: int = 256,
    ):
        if write_policy not in WRITE_POLICIES:
            raise ValueError(f"hicache_write_policy: must be one of {', '.join(WRITE_POLICIES)}")
        self.kv = kv
        self.host = host
        self.disk = disk
        self.page_size = page_size
        self.write_policy = write_policy
        self.min_load_tokens = min_load_tokens
        self._closed = False
        self.tier_counters = {
            "hicache_demoted_tokens": 0,
            "hicache_host_evicted_tokens": 0,
            "hicache_loaded_host_tokens": 0,
            "hicache_loaded_disk_tokens": 0,
            "hicache_prefetched_pages": 0,
            "hicache_backed_up_tokens": 0,
            "hicache_dropped_tokens": 0,
        }
        self.tree = RadixCache(kv.allocator, page_size, spill=self._spill, on_split=self._split_tiers)
        self.host_tier = HostTier(kv, host, self.tree, self._write_to_disk, self.tier_counters)
        self.disk_tier = DiskTier(disk, identity, page_size, self.tier_counters, max_staged_pages)

    # -- the tree's contract, delegated ------------------------------------------------------

    @property
    def allocator(self) -> SlotAllocator:
        return self.tree.allocator

    @property
    def evictable_size(self) -> int:
        return self.tree.evictable_size

    @property
    def protected_size(self) -> int:
        return self.tree.protected_size

    @property
    def evicted_tokens(self) -> int:
        return self.tree.evicted_tokens

    def match_prefix(self, key: Sequence[int], namespace: str = "") -> MatchResult:
        return self.tree.match_prefix(key, namespace)

    def lock(self, node: TreeNode | None) -> None:
        self.tree.lock(node)

    def unlock(self, node: TreeNode | None) -> None:
        self.tree.unlock(node)

    def evict(self, num_tokens: int) -> int:
        """Free at least `num_tokens` device slots by demoting unlocked L1 leaves to L2 (LRU)."""
        return self.tree.evict(num_tokens)

    def insert(self, key: Sequence[int], slots: torch.Tensor, namespace: str = "") -> InsertResult:
        result = self.tree.insert(key, slots, namespace)
        node = result.node
        while node.parent is not None:  # L2 nodes on the path adopted device slots: droppable copies now
            if host_slots(node) is not None:
                self.host_tier.lru.push(node)
            node = node.parent
        # a node the tiers have no record of was just created by this insert: copy it down
        if self.write_policy == "write_through" and result.node.parent is not None and result.node.tier is None:
            self._persist(result.node)
        return result

    # -- moving KV between tiers ---------------------------------------------------------------

    def _spill(self, node: TreeNode) -> bool:
        """The tree evicts `node` from L1: keep it in L2 (True), or write it and its L2-only
        subtree to disk and let it leave the tree (no host room)."""
        n = len(node.key)
        if self.host_tier.backup(node):
            self.tier_counters["hicache_demoted_tokens"] += n
            return True
        self._write_to_disk(node)
        for below in self.tree.subtree(node):
            if below is not node and host_slots(below) is not None:
                self._write_to_disk(below)
                self.host_tier.free(below)
        self.tier_counters["hicache_dropped_tokens"] += n
        return False

    def _split_tiers(self, head: TreeNode, tail: TreeNode, n: int) -> None:
        """The tree cut a node: the head takes the first `n` tokens' host slots and page hashes."""
        if tail.tier is not None:
            head.tier = tail.tier.split(n)
            if host_slots(head) is not None:
                self.host_tier.lru.push(head)

    def _kv_source(self, node: TreeNode) -> tuple[Any, torch.Tensor]:
        """Where the node's KV is read from: its host copy if any, else its device slots."""
        slots = host_slots(node)
        return (self.host, slots) if slots is not None else (self.kv, node.value)

    def _write_to_disk(self, node: TreeNode) -> None:
        self.disk_tier.write(node, *self._kv_source(node))

    def _persist(self, node: TreeNode) -> None:
        """Write-through: copy an L1 node to L2 (best effort) and L3."""
        self.host_tier.backup(node)
        self._write_to_disk(node)

    def load_back(self, key: Sequence[int], namespace: str = "") -> int:
        """Promote the L2 part of `key`'s match, then the disk pages after it, into L1; returns the
        tokens loaded. Counts the admission for `write_through_selective`."""
        key = as_key(key)
        tick = self.tree.tick()
        walk = self.tree.walk(key, namespace, split=True, touch=tick)
        nodes = [node for node, _ in walk.path]
        for node in nodes:
            record(node, self.page_size).hits += 1
        on_device = nodes[: sum(1 for node in nodes if node.value is not None)]
        lower = nodes[len(on_device) :]
        disk_pages = self.disk_tier.pages_after(key, namespace, walk.length)
        loaded = []
        if lower or disk_pages:
            handle = on_device[-1] if on_device else walk.root
            loaded = self._load(namespace, handle, lower, disk_pages, key[walk.length :], tick)
        if self.write_policy == "write_through_selective":
            # after the load: copying down may evict L2 nodes, and `lower` had to stay put
            for node in on_device + loaded:
                if node.tier.hits == SELECTIVE_HITS:
                    self._persist(node)
        return sum(len(node.key) for node in loaded)

    def _load(
        self,
        namespace: str,
        handle: TreeNode | None,
        lower: list[TreeNode],
        disk_pages: list[bytes],
        rest: tuple,
        tick: int,
    ) -> list[TreeNode]:
        """Load the L2 nodes `lower` (below `handle`), then the disk pages (of `rest`, the key after
        the tree match) into L1, as much as free + evictable slots allow. Returns the nodes loaded."""
        p = self.page_size
        host_len = sum(len(n.key) for n in lower)
        if host_len + len(disk_pages) * p < self.min_load_tokens:
            return []
        pages = self.disk_tier.read(disk_pages)
        want = host_len + len(pages) * p
        if want < self.min_load_tokens:
            return []
        self.tree.lock(handle)  # the L1 part of the match must survive the eviction below
        self.host_tier.busy = set(lower)
        loaded: list[TreeNode] = []
        try:
            a = self.allocator
            want = min(want, self._aligned(a.num_free + self.tree.evictable_size))
            if a.num_free < want:
                self.tree.evict(want - a.num_free)
            want = min(want, self._aligned(a.num_free))
            if want < self.min_load_tokens or want == 0:
                return []
            slots = a.alloc(want)
            pos, parent = 0, handle
            for node in lower:
                if pos >= want:
                    break
                if len(node.key) > want - pos:
                    node = self.tree.split(node, want - pos)
                n = len(node.key)
                self.tree.put_on_device(node, slots[pos : pos + n])
                self.host_tier.load(node)
                loaded.append(node)
                pos, parent = pos + n, node
            n = (want - pos) // p * p
            if n:
                if parent is None or parent.parent is None:  # an emptied tenant root left the tree
                    parent = self.tree.root(namespace, create=True)
                node = self.tree.add_child(parent, rest[:n], slots[pos : pos + n], tick)
                scatter_kv(self.kv, node.value, torch.cat(pages[: n // p], dim=2))
                rec = record(node, p)
                rec.hashes, rec.hits = list(disk_pages[: n // p]), 1
                self.tier_counters["hicache_loaded_disk_tokens"] += n
                loaded.append(node)
            return loaded
        finally:
            self.host_tier.busy = set()
            for node in lower:  # skipped while busy
                self.host_tier.lru.push(node)
            self.tree.unlock(handle)

    def _aligned(self, n: int) -> int:
        return n - n % self.page_size

    # -- queries and read-ahead ---------------------------------------------------------------

    def prefix_match_length(self, key: Sequence[int], namespace: str = "") -> int:
        return sum(self.tier_lengths(key, namespace).values())

    def tier_lengths(self, key: Sequence[int], namespace: str = "") -> dict[str, int]:
        """How much of `key` each tier holds (device first, then host, then disk), no mutation."""
        key = as_key(key)
        walk = self.tree.walk(key, namespace, split=False)
        device = device_length(walk.path)
        disk = len(self.disk_tier.pages_after(key, namespace, walk.length)) * self.page_size
        return {"device": device, "host": walk.length - device, "disk": disk}

    def _pages_after_tree(self, key: Sequence[int], namespace: str) -> list[bytes]:
        key = as_key(key)
        return self.disk_tier.pages_after(key, namespace, self.tree.walk(key, namespace, split=False).length)

    def prefetch(self, key: Sequence[int], namespace: str = "") -> None:
        """Start reading the disk pages that follow `key`'s tree match (a request was queued)."""
        if self.disk is not None:
            self.disk_tier.prefetch(self._pages_after_tree(key, namespace))

    def loading(self, key: Sequence[int], namespace: str = "") -> bool:
        """True while a prefetch of `key`'s disk pages is still reading."""
        return self.disk_tier.staged_pages > 0 and self.disk_tier.loading(self._pages_after_tree(key, namespace))

    # -- lifecycle, stats and checks ------------------------------------------------------------

    def reset(self) -> None:
        """Drop the whole tree from L1 and L2 (the disk store keeps its pages)."""
        if self.protected_size:
            raise RuntimeError("reset while requests hold locked prefixes")
        for node in self.tree.nodes():
            if host_slots(node) is not None:
                self.host_tier.free(node)
        self.host_tier.lru.clear()
        self.disk_tier.cancel_staged()
        self.tree.reset()

    def close(self) -> None:
        """Write every cached page that is not on disk yet, then wait for the disk writes."""
        if not self._closed:
            self._closed = True
            self.disk_tier.close(list(self.tree.nodes()), self._kv_source)

    def tier_stats(self) -> dict[str, Any]:
        h = self.host.allocator
        out: dict[str, Any] = dict(self.tier_counters)
        out.update(host_slots_total=h.num_slots, host_slots_free=h.num_free, host_slots_tree=h.num_slots - h.num_free)
        if self.disk is not None:
            out.update(self.disk.stats, disk_pages=self.disk.num_pages, disk_bytes=self.disk.used_bytes)
        return out

    def check_invariant(self, running_only_slots: int = 0) -> None:
        self.tree.check_invariant(running_only_slots)
        nodes = list(self.tree.nodes())
        for node in nodes:
            assert node.value is not None or host_slots(node) is not None, f"{node!r} is in no tier"
        self.host_tier.check_invariant(nodes)


def build_hiradix_cache(cfg: Any, kv: KVPool, model_dir: Any, numerics: str = "") -> HiRadixCache:
    """The tiered cache for an engine config (`host_pool_tokens > 0`); `numerics`: the weight
    format and attention backend, part of the disk pages' identity (disk_store.model_identity)."""
    page = cfg.hicache_page_tokens  # EngineConfig checked it (>= 1, a multiple of page_size)
    host = HostKVPool.like(kv, cfg.host_pool_tokens)
    identity = model_identity(model_dir, kv.dtype, kv.num_layers, kv.kv_heads, kv.head_dim, numerics)
    disk = None
    if cfg.disk_cache_dir:
        disk = DiskStore(
            cfg.disk_cache_dir,
            identity,
            page,
            kv.num_layers,
            kv.kv_heads,
            kv.head_dim,
            kv.dtype,
            max_bytes=cfg.disk_cache_bytes,
        )
    staged = max(16, cfg.host_pool_tokens // page)
    return HiRadixCache(
        kv,
        host,
        page,
        disk,
        cfg.hicache_write_policy,
        cfg.hicache_min_load_tokens,
        identity=identity,
        max_staged_pages=staged,
    )
