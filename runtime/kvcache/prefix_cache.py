"""Prefix-cache interface shared by the radix cache and the disabled cache.

Ownership and locking contract (every implementation follows it, so the engine treats them alike):

* Ownership. Every KV slot has exactly one owner: the allocator (free), the cache (the tree holds
  it), or one running request (slots it allocated and has not handed over yet). The accounting
  invariant is `allocator.num_free + cache.total_size + running-only slots == allocator.num_slots`.

* `match_prefix(key)` -> `MatchResult(slots, node, length)`. `slots[:length]` are the cache's own
  slots for `key[:length]`; the caller may read them but never frees them. `node` is an opaque
  handle (the last matched node). The match may be evicted at any later call unless locked, so
  call `lock(node)` right away, before anything else can evict.

* `lock(node)` / `unlock(node)`: a request locks its handle while it uses the matched slots and
  unlocks it exactly once when done. Locking pins the whole path from the handle to the root,
  so none of it is evicted. Unlocking more often than locking raises.

* `insert(key, slots)` -> `InsertResult(node, cached_len)`. The cache takes ownership of
  `slots[cached_len:aligned]` where `aligned = len(key) // page_size * page_size` (only whole pages
  are cached). `node` is the node of the inserted path (a handle like `MatchResult.node`, not
  locked) and `cached_len` how much of `key` the device already held. It does not free anything
  itself. The CALLER then frees exactly:
    - `slots[matched_len:cached_len]`: positions someone else cached since this caller's match,
      so the caller's copies are duplicates (`matched_len` is the length of the match whose
      handle the caller holds, 0 if it never matched; `slots[:matched_len]` are the cache's own);
    - `slots[aligned:]`: the partial last page, which the cache did not take.
  After that the caller owns none of `slots`. A caller that keeps running after an insert must
  re-match to get the cache's slots for the positions it freed. `cache_finished` does all of it.

* `load_back(key)` -> tokens loaded. A tiered cache brings what its lower tiers (host, disk) hold
  of `key` beyond the device match into device slots, evicting unlocked leaves for room; the
  cache manager calls it at admission right before `match_prefix`. `match_prefix` itself is
  pure: it returns the device part only and never loads. A one-tier cache loads nothing.

* `evict(n)` frees at least `n` tokens (if that many are evictable) of unlocked leaves, least
  recently used first, returning the slots to the allocator; it returns the number freed.

* The disabled cache (`NoPrefixCache`) fits the same contract: a match is always empty,
  `insert` takes nothing and returns `cached_len = len(key)` ("all of it is a duplicate"), so
  the same caller code frees every slot of the finished request.

Keys are token-id sequences; `namespace` (tenant + cache salt) separates trees so no prefix is
ever shared across namespaces.
"""

from __future__ import annotations

import abc
from typing import Any, NamedTuple, Sequence

import torch

from runtime.kvcache.pool import SlotAllocator


class MatchResult(NamedTuple):
    slots: torch.Tensor  # int64, the cache's own slots for key[:length]
    node: Any  # handle for lock/unlock
    length: int


class InsertResult(NamedTuple):
    node: Any  # the node of the inserted path (unlocked); None for the disabled cache
    cached_len: int  # how much of the key the device held before: the caller's duplicates end here


_EMPTY_SLOTS = torch.empty(0, dtype=torch.int64)


class BasePrefixCache(abc.ABC):
    page_size: int = 1

    @abc.abstractmethod
    def match_prefix(self, key: Sequence[int], namespace: str = "") -> MatchResult: ...

    @abc.abstractmethod
    def prefix_match_length(self, key: Sequence[int], namespace: str = "") -> int:
        """Length `match_prefix` would return after `load_back` (so a tiered cache counts its
        lower tiers too), without mutating anything (for scheduling)."""

    @abc.abstractmethod
    def insert(self, key: Sequence[int], slots: torch.Tensor, namespace: str = "") -> InsertResult: ...

    @abc.abstractmethod
    def lock(self, node: Any) -> None: ...

    @abc.abstractmethod
    def unlock(self, node: Any) -> None: ...

    @abc.abstractmethod
    def evict(self, num_tokens: int) -> int: ...

    @abc.abstractmethod
    def reset(self) -> None: ...

    @abc.abstractmethod
    def check_invariant(self, running_only_slots: int = 0) -> None: ...

    @property
    @abc.abstractmethod
    def evictable_size(self) -> int: ...

    @property
    @abc.abstractmethod
    def protected_size(self) -> int: ...

    @property
    def total_size(self) -> int:
        return self.evictable_size + self.protected_size

    @property
    @abc.abstractmethod
    def allocator(self) -> SlotAllocator: ...

    # -- tiers (HiRadixCache); one-tier caches keep these defaults --------------------------

    def tier_lengths(self, key: Sequence[int], namespace: str = "") -> dict[str, int]:
        """How much of `key` each tier holds, without mutating anything (`explain_prefix`)."""
        return {"device": self.prefix_match_length(key, namespace), "host": 0, "disk": 0}

    def load_back(self, key: Sequence[int], namespace: str = "") -> int:
        """Bring what lower tiers hold of `key` (beyond the device match) into device slots, so the
        next `match_prefix` finds it; returns the tokens loaded. The cache manager calls it
        explicitly before matching at admission; `match_prefix` itself never loads."""
        return 0

    def prefetch(self, key: Sequence[int], namespace: str = "") -> None:  # noqa: B027 - optional hook
        """A request with this key was queued: start loading what lower tiers hold of it."""

    def loading(self, key: Sequence[int], namespace: str = "") -> bool:
        """True while a prefetch for `key` is still in flight (the engine admits others first)."""
        return False

    def tier_stats(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:  # noqa: B027 - optional hook
        """Engine shutdown: persist what should survive a restart and stop helper threads."""

    def cache_finished(
        self, key: Sequence[int], slots: torch.Tensor, node: Any, matched_len: int, namespace: str = ""
    ) -> int:
        """Hand a finished request's KV to the cache and release its lock.

        `slots[i]` is the slot of `key[i]`; `node`/`matched_len` come from the request's locked
        match. Frees the duplicates and the partial last page as the contract says; returns
        the cached length. Afterwards the request owns no slots.
        """
        if slots.numel() != len(key):
            raise ValueError(f"{slots.numel()} slots for {len(key)} tokens")
        cached_len = self.insert(key, slots, namespace).cached_len
        if cached_len < matched_len:
            raise RuntimeError("insert found less than the locked match: namespace/key mismatch")
        aligned = len(key) // self.page_size * self.page_size
        self.allocator.free(slots[matched_len:cached_len])
        self.allocator.free(slots[aligned:])
        self.unlock(node)
        return cached_len


class NoPrefixCache(BasePrefixCache):
    """Cache disabled: nothing is ever cached; every finished request frees all its slots."""

    def __init__(self, allocator: SlotAllocator):
        self._allocator = allocator
        self.evicted_tokens = 0

    @property
    def allocator(self) -> SlotAllocator:
        return self._allocator

    def match_prefix(self, key: Sequence[int], namespace: str = "") -> MatchResult:
        return MatchResult(_EMPTY_SLOTS, None, 0)

    def prefix_match_length(self, key: Sequence[int], namespace: str = "") -> int:
        return 0

    def insert(self, key: Sequence[int], slots: torch.Tensor, namespace: str = "") -> InsertResult:
        # Takes nothing; "everything is already cached" makes the caller free slots[0:len(key)].
        return InsertResult(None, len(key))

    def lock(self, node: Any) -> None:
        pass

    def unlock(self, node: Any) -> None:
        pass

    def evict(self, num_tokens: int) -> int:
        return 0

    def reset(self) -> None:
        pass

    def check_invariant(self, running_only_slots: int = 0) -> None:
        a = self._allocator
        assert a.num_free + running_only_slots == a.num_slots, (a.num_free, running_only_slots, a.num_slots)

    @property
    def evictable_size(self) -> int:
        return 0

    @property
    def protected_size(self) -> int:
        return 0
