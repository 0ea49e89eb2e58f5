"""The disk tier (L3) of the tiered cache: which of a key's pages are on disk, and moving them.

Pages are `page_size` tokens, the tree's own page size, named by the chained hash of
`disk_store.py`, so a node is a whole number of pages and a page is on disk when its file exists:
no per-node state but the cached hashes (`TierRecord.hashes`). Reads run ahead: `prefetch`
stages reads of the pages after a queued key's tree match on the store's reader pool; `read`
takes the staged results (or reads now) when the pages are loaded.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from concurrent.futures import Future

import torch

from runtime.kvcache.pool import KVPool
from runtime.kvcache.radix_cache import TreeNode
from runtime.kvcache.tiers.disk_store import DiskStore, chain_hash, chain_seed
from runtime.kvcache.tiers.host_pool import HostKVPool, gather_kv
from runtime.kvcache.tiers.tier_record import record

log = logging.getLogger("jumpgate.hicache")


class DiskTier:
    def __init__(
        self,
        store: DiskStore | None,
        identity: str,
        page_size: int,
        counters: dict[str, int],
        max_staged_pages: int = 256,
    ):
        self.store = store
        self.identity = store.identity if store is not None else identity
        self.page_size = page_size
        self.counters = counters
        self.max_staged_pages = max_staged_pages
        self._staged: OrderedDict[bytes, Future] = OrderedDict()  # prefetched reads by page hash

    @property
    def staged_pages(self) -> int:
        """Prefetched pages not taken yet (read or still reading)."""
        return len(self._staged)

    def _chain(self, prev: bytes, key: tuple, start: int, end: int):
        for i in range(start, end, self.page_size):
            prev = chain_hash(prev, key[i : i + self.page_size])
            yield prev

    def hashes(self, node: TreeNode) -> list[bytes]:
        """Page hashes of `node`'s pages (computed once, from the parent's last hash)."""
        if node.parent is None:
            return [chain_seed(self.identity, self.page_size, node.namespace)]
        rec = record(node, self.page_size)
        if rec.hashes is None:
            rec.hashes = list(self._chain(self.hashes(node.parent)[-1], node.key, 0, len(node.key)))
        return rec.hashes

    def pages_after(self, key: tuple, namespace: str, start: int) -> list[bytes]:
        """Hashes of the consecutive pages of `key` from `start` on that are on disk."""
        end = len(key) - len(key) % self.page_size
        if self.store is None or start >= end:
            return []
        prev = chain_seed(self.identity, self.page_size, namespace)
        for h in self._chain(prev, key, 0, start):  # the hash of the page before `start`
            prev = h
        out = []
        for h in self._chain(prev, key, start, end):
            if not self.store.contains(h):
                break
            out.append(h)
        return out

    def write(self, node: TreeNode, pool: KVPool | HostKVPool, slots: torch.Tensor, block: bool = False) -> None:
        """Queue the node's pages that are not on disk yet; `slots` of `pool` hold its KV."""
        if self.store is None:
            return
        hashes = self.hashes(node)
        missing = [i for i, h in enumerate(hashes) if not self.store.contains(h)]
        if not missing:
            return
        p = self.page_size
        data = gather_kv(pool, torch.cat([slots[i * p : (i + 1) * p] for i in missing]))
        for j, i in enumerate(missing):
            self.store.write(hashes[i], data[:, :, j * p : (j + 1) * p], block=block)

    def read(self, hashes: list[bytes]) -> list[torch.Tensor]:
        """The pages' KV, stopping at the first one that is missing or corrupt."""
        out = []
        for h in hashes:
            fut = self._staged.pop(h, None)
            try:
                data = fut.result() if fut is not None else self.store.read(h)
            except Exception:  # a failed read is a miss
                log.exception("disk KV cache: reading a page failed")
                data = None
            if data is None:
                for rest in hashes[len(out) + 1 :]:  # pages after a miss are of no use
                    fut = self._staged.pop(rest, None)
                    if fut is not None:
                        fut.cancel()
                break
            out.append(data)
        return out

    def prefetch(self, hashes: list[bytes]) -> None:
        for h in hashes:
            if h not in self._staged:
                self._staged[h] = self.store.read_async(h)
                self.counters["hicache_prefetched_pages"] += 1
        while len(self._staged) > self.max_staged_pages:  # requests that left before admission
            self._staged.popitem(last=False)[1].cancel()

    def loading(self, hashes: list[bytes]) -> bool:
        return any(h in self._staged and not self._staged[h].done() for h in hashes)

    def cancel_staged(self) -> None:
        for fut in self._staged.values():
            fut.cancel()
        self._staged.clear()

    def close(self, nodes: list[TreeNode], source) -> None:
        """Write every page of `nodes` not on disk yet (`source(node)` -> (pool, slots)), then
        wait for the writes and stop the store's threads."""
        self.cancel_staged()
        if self.store is None:
            return
        try:
            for node in nodes:
                self.write(node, *source(node), block=True)
        finally:
            self.store.close()
