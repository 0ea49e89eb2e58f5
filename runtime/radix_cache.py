"""RadixAttention prefix cache: a radix tree from token-id segments to KV slot indices.

Anchors: SGLang `mem_cache/radix_cache.py`, mini-sglang `kvcache/radix_cache.py`. The locking and
slot-ownership contract is the one in `prefix_cache.py`.

Each namespace (tenant + cache salt) has its own root, so no prefix is shared across namespaces.
With `page_size > 1` every node's key is a whole number of pages and children are keyed by their
first page, so matches, inserts and splits happen only at page boundaries.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Sequence

import torch

from runtime.kv_pool import SlotAllocator
from runtime.prefix_cache import BasePrefixCache, MatchResult

_EMPTY_SLOTS = torch.empty(0, dtype=torch.int64)
_CHUNK = 64


def _common_len(a: tuple, b: tuple) -> int:
    """Length of the common prefix; slice compares run in C, so no per-token loop on a match."""
    n = min(len(a), len(b))
    a, b = a[:n], b[:n]
    if a == b:
        return n
    i = 0
    while a[i : i + _CHUNK] == b[i : i + _CHUNK]:  # stops: a mismatch exists before n
        i += _CHUNK
    while a[i] == b[i]:
        i += 1
    return i


def _as_key(key: Sequence[int]) -> tuple:
    if isinstance(key, torch.Tensor):
        return tuple(key.tolist())
    return key if isinstance(key, tuple) else tuple(key)


class TreeNode:
    __slots__ = ("id", "key", "value", "parent", "children", "lock_ref", "last_access",
                 "namespace", "evicted")
    _ids = itertools.count()

    def __init__(self, key: tuple = (), value: torch.Tensor = _EMPTY_SLOTS,
                 parent: TreeNode | None = None, namespace: str | None = None):
        self.id = next(TreeNode._ids)
        self.key = key  # token ids of this segment
        self.value = value  # int64 slots, one per token of `key`
        self.parent = parent
        self.children: dict = {}  # first token (or first page tuple) -> TreeNode
        self.lock_ref = 0
        self.last_access = 0
        self.namespace = namespace  # set on roots only
        self.evicted = False

    @property
    def is_root(self) -> bool:
        return self.parent is None

    def __repr__(self) -> str:
        return f"TreeNode(id={self.id}, len={len(self.key)}, lock={self.lock_ref}, t={self.last_access})"


class RadixCache(BasePrefixCache):
    def __init__(self, allocator: SlotAllocator, page_size: int = 1):
        if page_size < 1:
            raise ValueError("page_size must be >= 1")
        self._allocator = allocator
        self.page_size = page_size
        self.evicted_tokens = 0  # cumulative, for metrics
        self._clock = itertools.count(1)
        self._init_tree()

    def _init_tree(self) -> None:
        self._roots: dict[str, TreeNode] = {"": TreeNode(namespace="")}
        self._leaves: set[TreeNode] = set()  # non-root nodes without children (locked or not)
        self._evictable = 0
        self._protected = 0

    # -- sizes ------------------------------------------------------------------------------

    @property
    def allocator(self) -> SlotAllocator:
        return self._allocator

    @property
    def evictable_size(self) -> int:
        return self._evictable

    @property
    def protected_size(self) -> int:
        return self._protected

    # -- helpers ----------------------------------------------------------------------------

    def _child_key(self, key: tuple, i: int = 0):
        return key[i] if self.page_size == 1 else key[i : i + self.page_size]

    def _aligned(self, n: int) -> int:
        return n - n % self.page_size

    def _split(self, child: TreeNode, n: int) -> TreeNode:
        """Cut `child` after `n` tokens; the new upper node keeps the lock count (same users)."""
        mid = TreeNode(child.key[:n], child.value[:n], child.parent)
        mid.lock_ref = child.lock_ref
        mid.last_access = child.last_access
        mid.children[self._child_key(child.key, n)] = child
        child.parent.children[self._child_key(child.key)] = mid
        child.key, child.value, child.parent = child.key[n:], child.value[n:], mid
        return mid

    def _walk(self, key: tuple, namespace: str, split: bool, touch: int):
        """Follow `key` from the namespace root; returns (last node, matched length, values)."""
        node = self._roots.get(namespace)
        if node is None:
            return None, 0, []
        end = self._aligned(len(key))
        i, values = 0, []
        while i < end:
            child = node.children.get(self._child_key(key, i))
            if child is None:
                break
            n = self._aligned(_common_len(child.key, key[i:i + len(child.key)]))
            if n < len(child.key):
                if not split:
                    i += n
                    break
                child = self._split(child, n)
            if touch:
                child.last_access = touch
            values.append(child.value)
            node, i = child, i + n
        return node, i, values

    # -- public API -------------------------------------------------------------------------

    def match_prefix(self, key: Sequence[int], namespace: str = "") -> MatchResult:
        node, length, values = self._walk(_as_key(key), namespace, split=True, touch=next(self._clock))
        if node is None:  # unknown namespace: a detached root is a valid handle (locks are no-ops)
            node = TreeNode(namespace=namespace)
        slots = torch.cat(values) if len(values) > 1 else (values[0] if values else _EMPTY_SLOTS)
        return MatchResult(slots, node, length)

    def prefix_match_length(self, key: Sequence[int], namespace: str = "") -> int:
        return self._walk(_as_key(key), namespace, split=False, touch=0)[1]

    def insert(self, key: Sequence[int], slots: torch.Tensor, namespace: str = "") -> int:
        key = _as_key(key)
        if slots.numel() < len(key):
            raise ValueError(f"{slots.numel()} slots for {len(key)} tokens")
        root = self._roots.get(namespace)
        if root is None:
            root = self._roots[namespace] = TreeNode(namespace=namespace)
        tick = next(self._clock)
        node, cached, _ = self._walk(key, namespace, split=True, touch=tick)
        end = self._aligned(len(key))
        if cached < end:
            # clone: `slots` is often a view of the request-to-token table, whose row is reused
            leaf = TreeNode(key[cached:end], slots[cached:end].to(torch.int64).clone(), node)
            leaf.last_access = tick
            node.children[self._child_key(leaf.key)] = leaf
            self._leaves.discard(node)
            self._leaves.add(leaf)
            self._evictable += end - cached
        return cached

    def lock(self, node: TreeNode | None) -> None:
        if node is None:
            return
        if node.evicted:
            raise RuntimeError("lock on an evicted node: lock right after match_prefix")
        while node.parent is not None:
            if node.lock_ref == 0:
                self._evictable -= len(node.key)
                self._protected += len(node.key)
            node.lock_ref += 1
            node = node.parent

    def unlock(self, node: TreeNode | None) -> None:
        if node is None or node.parent is None:
            return
        # lock counts never grow toward the leaves, so checking the handle covers its path
        if node.lock_ref <= 0:
            raise RuntimeError(f"unlock without lock on {node!r}")
        while node.parent is not None:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self._protected -= len(node.key)
                self._evictable += len(node.key)
            node = node.parent

    def evict(self, num_tokens: int) -> int:
        if num_tokens <= 0:
            return 0
        heap = [(n.last_access, n.id, n) for n in self._leaves if n.lock_ref == 0]
        heapq.heapify(heap)
        freed = 0
        while freed < num_tokens and heap:
            _, _, node = heapq.heappop(heap)
            self._allocator.free(node.value)
            freed += len(node.key)
            self._evictable -= len(node.key)
            parent = node.parent
            del parent.children[self._child_key(node.key)]
            self._leaves.discard(node)
            node.evicted = True
            if parent.children:
                continue
            if parent.parent is not None:
                self._leaves.add(parent)
                if parent.lock_ref == 0:
                    heapq.heappush(heap, (parent.last_access, parent.id, parent))
            elif parent.namespace:  # empty tenant root: drop it so namespaces don't pile up
                self._roots.pop(parent.namespace, None)
        self.evicted_tokens += freed
        return freed

    def reset(self) -> None:
        """Drop the whole tree, returning its slots to the allocator. Only with nothing locked."""
        if self._protected:
            raise RuntimeError("reset while requests hold locked prefixes")
        for node in self._nodes():
            self._allocator.free(node.value)
        self._init_tree()

    # -- debugging --------------------------------------------------------------------------

    def _nodes(self):
        """All non-root nodes, depth first."""
        stack = [c for r in self._roots.values() for c in r.children.values()]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def check_invariant(self, running_only_slots: int = 0) -> None:
        evictable = protected = 0
        leaves, values = set(), []
        for node in self._nodes():
            assert len(node.key) == node.value.numel() > 0, node
            assert len(node.key) % self.page_size == 0, node
            assert node.parent.children.get(self._child_key(node.key)) is node, node
            assert 0 <= node.lock_ref <= node.parent.lock_ref or node.parent.parent is None, node
            assert node.lock_ref >= 0 and not node.evicted, node
            if node.lock_ref:
                protected += len(node.key)
            else:
                evictable += len(node.key)
            if not node.children:
                leaves.add(node)
            values.append(node.value)
        assert (evictable, protected) == (self._evictable, self._protected), \
            ((evictable, protected), (self._evictable, self._protected))
        assert leaves == self._leaves, "leaf set out of date"
        total = evictable + protected
        if values:
            assert torch.cat(values).unique().numel() == total, "a slot is held twice"
        a = self._allocator
        assert a.num_free + total + running_only_slots == a.num_slots, \
            f"free {a.num_free} + tree {total} + running {running_only_slots} != {a.num_slots}"

    def pretty_print(self) -> str:
        lines = []

        def show(node: TreeNode, depth: int) -> None:
            for child in node.children.values():
                head = list(child.key[:8]) + (["..."] if len(child.key) > 8 else [])
                lines.append(f"{'  ' * depth}{head} len={len(child.key)} lock={child.lock_ref} t={child.last_access}")
                show(child, depth + 1)

        for ns, root in self._roots.items():
            lines.append(f"namespace {ns!r}")
            show(root, 1)
        lines.append(f"evictable={self._evictable} protected={self._protected}")
        out = "\n".join(lines)
        print(out)
        return out
