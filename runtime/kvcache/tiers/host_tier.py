"""The host tier (L2) of the tiered cache: copies of radix nodes' KV in a host pool.

Anchor: SGLang `mem_cache/hiradix_cache.py` (host side). A node holds host slots in its
`TierRecord.host`. Host slots run out -> `evict`, least recently used first, over an `LRUQueue`
of the nodes that may lose their copy: a node also on the device just drops it; a node only in
this tier without children is handed to `before_drop` (the disk write) and leaves the tree.
Nodes being loaded (`busy`) are skipped.
"""

from __future__ import annotations

from typing import Callable

import torch

from runtime.kvcache.lru_queue import LRUQueue
from runtime.kvcache.pool import KVPool
from runtime.kvcache.radix_cache import RadixCache, TreeNode
from runtime.kvcache.tiers.host_pool import HostKVPool, copy_kv
from runtime.kvcache.tiers.tier_record import host_slots, record


class HostTier:
    def __init__(
        self,
        kv: KVPool,
        host: HostKVPool,
        tree: RadixCache,
        before_drop: Callable[[TreeNode], None],
        counters: dict[str, int],
    ):
        self.kv = kv
        self.host = host
        self.tree = tree
        self.before_drop = before_drop
        self.counters = counters
        self.busy: set[TreeNode] = set()
        self.lru = LRUQueue(self._evictable)

    def _evictable(self, node: TreeNode) -> bool:
        return (
            host_slots(node) is not None
            and not node.evicted
            and node not in self.busy
            and (node.value is not None or not node.children)
        )

    def backup(self, node: TreeNode) -> bool:
        """Copy a device node's KV into host slots (it stays on the device); False: no room."""
        if host_slots(node) is not None:
            return True
        n = len(node.key)
        a = self.host.allocator
        if a.num_free < n:
            self.evict(n - a.num_free)
        slots = a.alloc(n)
        if slots is None:
            return False
        copy_kv(self.kv, node.value, self.host, slots)
        record(node, self.tree.page_size).host = slots
        self.lru.push(node)
        self.counters["hicache_backed_up_tokens"] += n
        return True

    def load(self, node: TreeNode) -> None:
        """Copy the host KV of a node that was just given device slots into them."""
        copy_kv(self.host, node.tier.host, self.kv, node.value)
        self.lru.push(node)  # on the device now: its copy may be dropped even if it has children
        self.counters["hicache_loaded_host_tokens"] += len(node.key)

    def free(self, node: TreeNode) -> None:
        """Return the node's host slots (it is leaving the tier)."""
        self.host.allocator.free(node.tier.host)
        node.tier.host = None

    def evict(self, num_tokens: int) -> int:
        """Free at least `num_tokens` host slots, LRU (see the module docstring)."""
        freed = 0
        while freed < num_tokens:
            node = self.lru.pop()
            if node is None:
                break
            off_device = node.value is None
            if off_device:
                self.before_drop(node)
            self.free(node)
            freed += len(node.key)
            if off_device:
                parent = node.parent
                self.tree.remove(node)
                if parent.parent is not None:
                    self.lru.push(parent)  # may be childless now
        self.counters["hicache_host_evicted_tokens"] += freed
        return freed

    def check_invariant(self, nodes: list[TreeNode]) -> None:
        held = []
        for node in nodes:
            slots = host_slots(node)
            assert node not in self.busy, node
            if slots is not None:
                assert slots.numel() == len(node.key), node
                assert not self._evictable(node) or node in self.lru, f"{node!r} evictable but not queued"
                held.append(slots)
        total = sum(s.numel() for s in held)
        if held:
            assert torch.cat(held).unique().numel() == total, "a host slot is held twice"
        h = self.host.allocator
        assert h.num_free + total == h.num_slots, f"L2: free {h.num_free} + tree {total} != {h.num_slots}"
