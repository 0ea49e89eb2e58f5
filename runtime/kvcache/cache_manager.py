"""The cache manager: the only user of the prefix cache (runtime/kvcache/prefix_cache.py).

Every request's KV bookkeeping goes through here: matching and locking its cached prefix at
admission (after the explicit `load_back` step that brings lower-tier KV to the device), handing
its computed KV to the cache as it progresses, freeing rejected draft slots, and releasing its KV
when it finishes or is retracted; also pinned prefixes, eviction on demand and the cache's numbers.

Ownership: runs on the engine thread only (the tree is never touched elsewhere). Slot ownership
follows the contract in prefix_cache.py; a request's slots live in its row of the req-to-token
table, which this class allocates and frees.
"""

from __future__ import annotations

import time
from typing import Any, Hashable, Sequence

from runtime.api import EngineError
from runtime.counters import EngineCounters
from runtime.kvcache.pool import ReqToTokenTable, SlotAllocator
from runtime.kvcache.prefix_cache import BasePrefixCache, MatchResult, NoPrefixCache
from runtime.kvcache.window_pool import TRIM_EVERY, TRIM_SLACK, WindowSlots
from runtime.request import Req

# Long decodes hand their KV to the prefix cache every this many tokens, so a request arriving
# mid-way (a retry, a fork) reuses it.
CACHE_PROGRESS_EVERY = 128


class CacheManager:
    def __init__(self, cache: BasePrefixCache, req_table: ReqToTokenTable, counters: EngineCounters):
        self.prefix_cache = cache
        self.allocator: SlotAllocator = cache.allocator
        self.req_table = req_table
        self.counters = counters
        self.pins: dict[tuple[str, str], tuple[Any, int]] = {}  # (namespace, name) -> (locked node, tokens)
        # the window layers' own slots (sliding-window models), None where every layer keeps all
        self.window: WindowSlots | None = getattr(self.allocator, "window", None)

    @property
    def enabled(self) -> bool:
        return not isinstance(self.prefix_cache, NoPrefixCache)

    # ------------------------------------------------------------------ scheduling queries

    @staticmethod
    def _key(r: Req) -> list[int]:
        # The last token is never matched: its logits are needed, so it is always fed.
        return r.token_ids[:-1]

    def match_length(self, r: Req) -> int:
        return self.prefix_cache.prefix_match_length(self._key(r), r.namespace)

    def prefix_path(self, r: Req) -> Sequence[Hashable]:
        """The tree nodes from the root to where `r`'s match ends (dfs-weight ordering). Relies on
        the contract that `match_prefix` never loads; an unlocked match is harmless."""
        node = self.prefix_cache.match_prefix(self._key(r), r.namespace).node
        path = []
        while node is not None:
            path.append(node)
            node = node.parent
        return path[::-1]

    def prefetch(self, r: Req) -> None:
        self.prefix_cache.prefetch(self._key(r), r.namespace)

    def loading(self, r: Req) -> bool:
        return self.prefix_cache.loading(self._key(r), r.namespace)

    @property
    def free_rows(self) -> int:
        return self.req_table.num_free_rows

    # ------------------------------------------------------------------ admission

    def lock_prefix(self, r: Req) -> MatchResult:
        """Bring lower tiers' part of `r`'s prefix to the device, match it and lock the match."""
        key = self._key(r)
        self.prefix_cache.load_back(key, r.namespace)
        m = self.prefix_cache.match_prefix(key, r.namespace)
        if self.window is not None and m.length:  # only as far as the window KV it needs is there
            exact = self.window.exact_length(m.slots, m.length, self.prefix_cache.page_size)
            if exact < m.length:
                m = self.prefix_cache.match_prefix(key[:exact], r.namespace)
        self.prefix_cache.lock(m.node)
        return m

    def unlock(self, m: MatchResult) -> None:
        self.prefix_cache.unlock(m.node)

    def attach(self, r: Req, m: MatchResult) -> None:
        """Give `r` a row holding its locked match; its KV starts there."""
        r.row = self.req_table.alloc_row()
        r.node, r.kv_len, r.cached_len, r.window_from = m.node, m.length, m.length, m.length
        if m.length:
            self.req_table.write(r.row, 0, m.slots)

    def ensure_free(self, n: int) -> bool:
        """Room for `n` new tokens (full slots, and window slots where the model has window
        layers), releasing unlocked prefixes' window KV, then evicting unlocked prefixes, if needed."""
        a = self.allocator
        if a.room < n:
            t0 = time.perf_counter()
            if self.window is not None and self.window.allocator.num_free < n:
                self._release_tree_window(n - self.window.allocator.num_free)
            if a.num_free < n:  # (evicting more could not help the window: no unlocked node holds any)
                self.prefix_cache.evict(n - a.num_free)
            self.counters.tree_seconds += time.perf_counter() - t0
        return a.room >= n

    # ------------------------------------------------------------------ running requests

    def cache_progress(self, r: Req) -> None:
        """Hand the computed part of a running request to the prefix cache and re-lock it."""
        if not self.enabled or r.row is None:
            return
        t0 = time.perf_counter()
        key = r.token_ids[: r.kv_len]
        slots = self.req_table.slots(r.row, r.kv_len).clone()
        cached = self.prefix_cache.insert(key, slots, r.namespace).cached_len
        m = self.prefix_cache.match_prefix(key, r.namespace)
        if self.window is not None:  # the cache's copies take our window KV where theirs is released
            self.window.adopt(m.slots[r.cached_len : cached], slots[r.cached_len : cached])
        self.allocator.free(slots[r.cached_len : cached])
        self.req_table.write(r.row, 0, m.slots)
        self.prefix_cache.lock(m.node)
        self.prefix_cache.unlock(r.node)
        r.node, r.cached_len = m.node, m.length
        self.counters.tree_seconds += time.perf_counter() - t0

    # ------------------------------------------------------------------ window layers' KV

    def trim_window(self, r: Req) -> None:
        """Release the window KV of `r`'s positions that no later token of it sees (window_pool.py):
        its own, and those of tree nodes only it has locked; a prefix matched at admission (or
        locked by others) keeps its window KV for other requests."""
        w = self.window
        if w is None or r.row is None:
            return
        end = r.kv_len - w.window + 1 - TRIM_SLACK
        if end - r.window_from < TRIM_EVERY:
            return
        slots = self.req_table.slots(r.row, end)
        own_from = max(r.window_from, r.cached_len)
        if own_from < end:
            w.release(slots[own_from:end])
        node, node_end = r.node, r.cached_len  # r's locked path, leaf to root
        while node is not None and node.parent is not None and node_end > r.window_from:
            start = node_end - len(node.key)
            lo, hi = max(start, r.window_from), min(node_end, end)
            if lo < hi and node.lock_ref == 1:  # r's lock alone
                w.release(slots[lo:hi])
            node, node_end = node.parent, start
        r.window_from = end

    def _release_tree_window(self, n: int) -> None:
        """Window KV of unlocked cached prefixes, least recently used first, until `n` window
        slots were released (or none is left): their full-layer KV stays cached, and a match
        through them stops where the window KV it needs is gone."""
        nodes = getattr(self.prefix_cache, "nodes", None)
        if nodes is None:
            return
        held = [x for x in nodes() if x.lock_ref == 0 and x.value is not None]
        released = 0
        for x in sorted(held, key=lambda x: x.last_access):
            released += self.window.release(x.value)
            if released >= n:
                break

    def free_positions(self, r: Req, start: int, end: int) -> None:
        """Free the slots of `r`'s positions [start, end) (rejected draft tokens)."""
        self.allocator.free(self.req_table.slots(r.row, end)[start:].clone())

    def truncate(self, r: Req, length: int) -> None:
        """Keep KV only for `r`'s positions [0, length) (a rewritten value): its own slots past
        that are freed; a cached part reaching past it is re-locked at `length` (positions after
        the match are computed again). With window layers, `length` first shrinks to where the
        window KV its next token sees is all there."""
        if self.window is not None and r.row is not None:
            cut = min(length, r.kv_len)
            row = self.req_table.slots(r.row, cut)
            exact = self.window.exact_length(row, cut)
            if exact < r.cached_len:  # matched again below: whole pages
                exact = self.window.exact_length(row, exact, self.prefix_cache.page_size)
            length = exact if exact < cut else length
            r.window_from = min(r.window_from, length)
        own_from = max(length, r.cached_len)
        if r.kv_len > own_from:
            self.free_positions(r, own_from, r.kv_len)
        if length >= r.cached_len:
            r.kv_len = min(r.kv_len, length)
            return
        m = self.prefix_cache.match_prefix(r.token_ids[:length], r.namespace)
        self.prefix_cache.lock(m.node)
        self.prefix_cache.unlock(r.node)
        self.req_table.write(r.row, 0, m.slots)
        r.node, r.cached_len, r.kv_len = m.node, m.length, m.length

    def release(self, r: Req) -> None:
        """Give the request's KV to the cache (or free it) and its row back."""
        if r.row is None:
            return
        t0 = time.perf_counter()
        if r.pass_end is not None and r.pass_end > r.kv_len:  # a failed step left this pass's slots behind
            self.free_positions(r, r.kv_len, r.pass_end)
        r.pass_end = None
        key = r.token_ids[: r.kv_len]
        slots = self.req_table.slots(r.row, r.kv_len).clone()
        self.prefix_cache.cache_finished(key, slots, r.node, r.cached_len, r.namespace)
        self.req_table.free_row(r.row)
        r.row, r.node, r.kv_len, r.cached_len = None, None, 0, 0
        self.counters.tree_seconds += time.perf_counter() - t0

    # ------------------------------------------------------------------ pins

    def pinned(self, key: tuple[str, str]) -> int | None:
        """Tokens pinned under `key`, None if nothing is."""
        return self.pins[key][1] if key in self.pins else None

    def check_pin_budget(self, tokens: int, budget: int) -> None:
        if not self.enabled:
            raise EngineError("pinning needs the prefix cache (radix_cache is off)", code="pinning_unavailable")
        used = sum(n for _, n in self.pins.values())
        if used + tokens > budget:
            raise EngineError(
                f"pinning {tokens} tokens would exceed the pin budget: {used} of {budget} tokens are "
                "pinned already" + ("" if budget else " (pinning is off: set pin_budget_tokens)"),
                code="pin_budget_exceeded",
                param="pin",
            )

    def pin(self, key: tuple[str, str], ids: list[int], namespace: str) -> int:
        """Lock the cached prefix of `ids` (prefilled just before) under `key`."""
        m = self.prefix_cache.match_prefix(ids, namespace)
        self.prefix_cache.lock(m.node)
        self.pins[key] = (m.node, m.length)
        return m.length

    def unpin(self, key: tuple[str, str]) -> int:
        node, n = self.pins.pop(key, (None, 0))
        if node is not None:
            self.prefix_cache.unlock(node)
        return n

    # ------------------------------------------------------------------ introspection

    def tier_lengths(self, ids: list[int], namespace: str) -> dict[str, int]:
        return self.prefix_cache.tier_lengths(ids, namespace)

    def evict_all(self) -> None:
        self.prefix_cache.evict(self.prefix_cache.evictable_size)

    def gauges(self) -> dict[str, Any]:
        """The cache's part of an EngineStats snapshot."""
        a, tree = self.allocator, self.prefix_cache.total_size
        tier = dict(self.prefix_cache.tier_stats())
        by_tier = {"device": tree}
        if "host_slots_tree" in tier:
            by_tier["host"] = tier["host_slots_tree"]
        return dict(
            kv_slots_total=a.num_slots,
            kv_slots_free=a.num_free,
            kv_slots_tree=tree,
            kv_slots_evictable=self.prefix_cache.evictable_size,
            kv_slots_request_only=a.num_slots - a.num_free - tree,
            kv_window_slots_total=self.window.num_slots if self.window else 0,
            kv_window_slots_free=self.window.allocator.num_free if self.window else 0,
            evicted_tokens=self.prefix_cache.evicted_tokens,
            cached_tokens_by_tier=by_tier,
            tier_counters=tier,
        )

    def check_invariant(self, running_only_slots: int) -> None:
        self.prefix_cache.check_invariant(running_only_slots=running_only_slots)
        if self.window is not None:
            self.window.check_invariant(self.allocator)

    def close(self) -> None:
        self.prefix_cache.close()
