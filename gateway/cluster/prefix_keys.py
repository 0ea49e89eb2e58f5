"""The routing key: chained hashes of a prompt's token blocks, salted by the cache namespace.

Block i's key hashes the namespace and every token up to the end of block i, so two prompts share
the first k keys exactly when they share a namespace and their first k blocks: the same prefixes
the radix cache can reuse (it never shares across namespaces). Replicas summarise what they hold
as a set of these keys; the router counts how many leading keys of a request a replica holds.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import Iterable, Sequence

BLOCK_TOKENS = 32  # coarse enough for a compact summary, fine enough to tell system prompts apart


def prefix_keys(prompt_ids: Sequence[int], namespace: str = "", block_tokens: int = BLOCK_TOKENS) -> list[int]:
    """One 64-bit key per complete block of `prompt_ids` (a tail shorter than a block has none)."""
    h = hashlib.blake2b(namespace.encode(), digest_size=8)
    keys = []
    for end in range(block_tokens, len(prompt_ids) + 1, block_tokens):
        h.update(b"".join(int(t).to_bytes(4, "little", signed=False) for t in prompt_ids[end - block_tokens : end]))
        keys.append(int.from_bytes(h.copy().digest(), "little"))
    return keys


def matched_blocks(keys: Sequence[int], held: set[int] | frozenset[int] | PrefixSummary) -> int:
    """How many leading keys of a request `held` contains (a prefix match stops at the first miss)."""
    n = 0
    for k in keys:
        if k not in held:
            break
        n += 1
    return n


class PrefixSummary:
    """A bounded, least-recently-used set of prefix keys: what one replica (probably) holds.

    Sized in blocks like the replica's KV pool, so it forgets roughly when the pool would evict.
    """

    def __init__(self, capacity_blocks: int):
        self.capacity = max(1, capacity_blocks)
        self._keys: OrderedDict[int, None] = OrderedDict()

    def add(self, keys: Iterable[int]) -> None:
        for k in keys:
            self._keys[k] = None
            self._keys.move_to_end(k)
        while len(self._keys) > self.capacity:
            self._keys.popitem(last=False)

    def replace(self, keys: Iterable[int]) -> None:
        self._keys.clear()
        self.add(keys)

    def __contains__(self, key: int) -> bool:
        return key in self._keys

    def __len__(self) -> int:
        return len(self._keys)

    def snapshot(self) -> list[int]:
        """Oldest first (so `add(snapshot)` rebuilds the same recency order)."""
        return list(self._keys)
