"""RadixAttention prefix cache: a radix tree from token-id segments to KV slot indices.

Anchors: SGLang `mem_cache/radix_cache.py`, mini-sglang `kvcache/radix_cache.py`. The locking and
slot-ownership contract is the one in `prefix_cache.py`.

Each namespace (tenant + cache salt) has its own root, so no prefix is shared across namespaces.
With `page_size > 1` every node's key is a whole number of pages and children are keyed by their
first page, so matches, inserts and splits happen only at page boundaries.

This is the one tree of the project; the tiered cache (`hiradix_cache.py`) is composed from it.
For that a node may be off the device (`value is None`: only a lower tier holds its KV) and may
carry a `tier` record the tree never reads (the `on_split` hook splits it). Device residency is
prefix-closed (a node on the device has its parent on the device), so the device part of a match
is a prefix of it. Eviction takes unlocked device leaves in LRU order from an `LRUQueue`, and
asks the `spill` hook (if any) whether a lower tier keeps the node; a one-tier cache has none, so
an evicted node leaves the tree.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, NamedTuple, Sequence

import torch

from runtime.kvcache.lru_queue import LRUQueue
from runtime.kvcache.pool import SlotAllocator
from runtime.kvcache.prefix_cache import BasePrefixCache, InsertResult, MatchResult

_EMPTY_SLOTS = torch.empty(0, dtype=torch.int64)
_CHUNK = 64


def common_len(a: tuple, b: tuple) -> int:
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


def as_key(key: Sequence[int]) -> tuple:
    if isinstance(key, torch.Tensor):
        return tuple(key.tolist())
    return key if isinstance(key, tuple) else tuple(key)


class TreeNode:
    __slots__ = ("id", "key", "value", "parent", "children", "lock_ref", "last_access", "namespace", "evicted", "tier")
    _ids = itertools.count()

    def __init__(
        self,
        key: tuple = (),
        value: torch.Tensor | None = _EMPTY_SLOTS,
        parent: TreeNode | None = None,
        namespace: str | None = None,
    ):
        self.id = next(TreeNode._ids)
        self.key = key  # token ids of this segment
        self.value = value  # int64 device slots, one per token of `key`; None = off the device
        self.parent = parent
        self.children: dict = {}  # first token (or first page tuple) -> TreeNode
        self.lock_ref = 0
        self.last_access = 0
        self.namespace = namespace  # set on roots only
        self.evicted = False  # left the tree: a handle to it can no longer be locked
        self.tier: Any = None  # the tiered cache's record of this node (opaque to the tree)

    @property
    def is_root(self) -> bool:
        return self.parent is None

    def __repr__(self) -> str:
        where = "dev" if self.value is not None else "off"
        return f"TreeNode(id={self.id}, len={len(self.key)}, {where}, lock={self.lock_ref}, t={self.last_access})"


class Walk(NamedTuple):
    root: TreeNode | None  # None: the namespace has no tree
    path: list  # (node, tokens of it used); without split the last may be used only partly
    length: int  # tokens matched, on and off the device


def device_length(path: list) -> int:
    """Tokens of a walk's path that are on the device (a prefix of it)."""
    n = 0
    for node, used in path:
        if node.value is None:
            break
        n += used
    return n


class RadixCache(BasePrefixCache):
    def __init__(
        self,
        allocator: SlotAllocator,
        page_size: int = 1,
        spill: Callable[[TreeNode], bool] | None = None,
        on_split: Callable[[TreeNode, TreeNode, int], None] | None = None,
    ):
        """Hooks of a tiered cache: `spill(node)` runs on every device eviction, before the node's
        slots are freed; True means a lower tier keeps its KV, so the node stays in the tree off
        the device. `on_split(head, tail, n)` runs when a node is cut after `n` tokens."""
        if page_size < 1:
            raise ValueError("page_size must be >= 1")
        self._allocator = allocator
        self.page_size = page_size
        self.spill = spill
        self.on_split = on_split
        self.evicted_tokens = 0  # cumulative, for metrics
        self._clock = itertools.count(1)
        self._lru = LRUQueue(self._is_device_leaf)
        self._init_tree()

    def _init_tree(self) -> None:
        self._roots: dict[str, TreeNode] = {"": TreeNode(namespace="")}
        self._lru.clear()
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

    @property
    def namespaces(self) -> list[str]:
        return list(self._roots)

    @property
    def lru(self) -> LRUQueue:
        """The queue of evictable device leaves (read-only use: tests, metrics)."""
        return self._lru

    # -- the tree ---------------------------------------------------------------------------

    def tick(self) -> int:
        """A new access time (later than every earlier one)."""
        return next(self._clock)

    def root(self, namespace: str, create: bool = False) -> TreeNode | None:
        root = self._roots.get(namespace)
        if root is None and create:
            root = self._roots[namespace] = TreeNode(namespace=namespace)
        return root

    def _child_key(self, key: tuple, i: int = 0):
        return key[i] if self.page_size == 1 else key[i : i + self.page_size]

    def _aligned(self, n: int) -> int:
        return n - n % self.page_size

    def split(self, child: TreeNode, n: int) -> TreeNode:
        """Cut `child` after `n` tokens; the new upper node keeps the lock count (same users)."""
        mid = TreeNode(child.key[:n], None, child.parent)
        if child.value is not None:
            mid.value, child.value = child.value[:n], child.value[n:]
        mid.lock_ref = child.lock_ref
        mid.last_access = child.last_access
        mid.children[self._child_key(child.key, n)] = child
        child.parent.children[self._child_key(child.key)] = mid
        child.key, child.parent = child.key[n:], mid
        if self.on_split is not None:
            self.on_split(mid, child, n)
        return mid

    def walk(self, key: Sequence[int], namespace: str, split: bool, touch: int = 0) -> Walk:
        """Follow `key` from the namespace root over nodes on and off the device, splitting the
        last node at the mismatch when `split`, stamping `touch` (if not 0) on the path."""
        key = as_key(key)
        node = root = self._roots.get(namespace)
        if root is None:
            return Walk(None, [], 0)
        end = self._aligned(len(key))
        i, path = 0, []
        while i < end:
            child = node.children.get(self._child_key(key, i))
            if child is None:
                break
            n = self._aligned(common_len(child.key, key[i : i + len(child.key)]))
            if n < len(child.key):
                if not split:
                    path.append((child, n))
                    i += n
                    break
                child = self.split(child, n)
            if touch:
                child.last_access = touch
            path.append((child, n))
            node, i = child, i + n
        return Walk(root, path, i)

    def add_child(self, parent: TreeNode, key: tuple, slots: torch.Tensor, touch: int) -> TreeNode:
        """A new device leaf under `parent` holding `slots` (the cache owns them from now on)."""
        leaf = TreeNode(key, slots, parent)
        leaf.last_access = touch
        parent.children[self._child_key(key)] = leaf
        self._evictable += len(key)
        self._lru.push(leaf)
        return leaf

    def put_on_device(self, node: TreeNode, slots: torch.Tensor) -> None:
        """An off-device node (its parent on the device) takes `slots`, filled with its KV."""
        assert node.value is None and slots.numel() == len(node.key), node
        node.value = slots
        self._evictable += len(node.key)
        self._lru.push(node)

    def remove(self, node: TreeNode) -> None:
        """Unlink an off-device node with its subtree (all off the device, holding no slots)."""
        for n in self.subtree(node):
            n.evicted = True
        parent = node.parent
        del parent.children[self._child_key(node.key)]
        if (
            parent.parent is None
            and not parent.children
            and parent.namespace
            and self._roots.get(parent.namespace) is parent
        ):
            del self._roots[parent.namespace]  # empty tenant root: don't let namespaces pile up

    def subtree(self, node: TreeNode):
        """`node` and its descendants, depth first."""
        stack = [node]
        while stack:
            n = stack.pop()
            yield n
            stack.extend(n.children.values())

    def nodes(self):
        """All non-root nodes, depth first (a full scan: checks, reset and shutdown only)."""
        for root in list(self._roots.values()):
            for child in list(root.children.values()):
                yield from self.subtree(child)

    # -- public API -------------------------------------------------------------------------

    def match_prefix(self, key: Sequence[int], namespace: str = "") -> MatchResult:
        """The device part of the match (it never loads from lower tiers: see `load_back`)."""
        walk = self.walk(key, namespace, split=True, touch=self.tick())
        if walk.root is None:  # unknown namespace: a detached root is a valid handle (locks are no-ops)
            return MatchResult(_EMPTY_SLOTS, TreeNode(namespace=namespace), 0)
        node, values = walk.root, []
        for child, _ in walk.path:
            if child.value is None:
                break
            node = child
            values.append(child.value)
        slots = torch.cat(values) if len(values) > 1 else (values[0] if values else _EMPTY_SLOTS)
        return MatchResult(slots, node, slots.numel())

    def prefix_match_length(self, key: Sequence[int], namespace: str = "") -> int:
        return device_length(self.walk(key, namespace, split=False).path)

    def insert(self, key: Sequence[int], slots: torch.Tensor, namespace: str = "") -> InsertResult:
        key = as_key(key)
        if slots.numel() < len(key):
            raise ValueError(f"{slots.numel()} slots for {len(key)} tokens")
        root = self.root(namespace, create=True)
        tick = self.tick()
        walk = self.walk(key, namespace, split=True, touch=tick)
        cached = pos = 0
        for node, n in walk.path:
            # clone: `slots` is often a view of the request-to-token table, whose row is reused
            if node.value is None:  # only in a lower tier: adopt the caller's slots (same tokens, same KV)
                self.put_on_device(node, slots[pos : pos + n].to(torch.int64).clone())
            else:
                cached = pos + n  # device residency is prefix-closed: it ends here at the latest
            pos += n
        node = walk.path[-1][0] if walk.path else root
        end = self._aligned(len(key))
        if walk.length < end:
            node = self.add_child(node, key[walk.length : end], slots[walk.length : end].to(torch.int64).clone(), tick)
        return InsertResult(node, cached)

    def lock(self, node: TreeNode | None) -> None:
        if node is None:
            return
        if node.evicted:
            raise RuntimeError("lock on an evicted node: lock right after match_prefix")
        if node.value is None:
            raise RuntimeError("lock on a node that is not on the device: lock right after match_prefix")
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
                self._lru.push(node)
            node = node.parent

    def _is_device_leaf(self, node: TreeNode) -> bool:
        """Evictable: unlocked, on the device, with no child on the device."""
        return (
            node.parent is not None
            and not node.evicted
            and node.value is not None
            and node.lock_ref == 0
            and not any(c.value is not None for c in node.children.values())
        )

    def evict(self, num_tokens: int) -> int:
        freed = 0
        while freed < num_tokens:
            node = self._lru.pop()
            if node is None:
                break
            kept = self.spill is not None and self.spill(node)
            n = len(node.key)
            self._allocator.free(node.value)
            node.value = None
            self._evictable -= n
            freed += n
            parent = node.parent
            if not kept:
                self.remove(node)
            if parent.parent is not None:
                self._lru.push(parent)
        self.evicted_tokens += freed
        return freed

    def reset(self) -> None:
        """Drop the whole tree, returning its slots to the allocator. Only with nothing locked."""
        if self._protected:
            raise RuntimeError("reset while requests hold locked prefixes")
        for node in self.nodes():
            if node.value is not None:
                self._allocator.free(node.value)
            node.evicted = True
        self._init_tree()

    # -- debugging --------------------------------------------------------------------------

    def check_invariant(self, running_only_slots: int = 0) -> None:
        evictable = protected = 0
        values = []
        for node in self.nodes():
            parent = node.parent
            assert len(node.key) > 0 and len(node.key) % self.page_size == 0, node
            assert parent.children.get(self._child_key(node.key)) is node, node
            assert 0 <= node.lock_ref <= parent.lock_ref or parent.parent is None, node
            assert not node.evicted, node
            if node.value is None:
                assert self.spill is not None, f"{node!r} is off the device without a lower tier"
                assert node.lock_ref == 0, f"{node!r} is locked but not on the device"
                continue
            assert node.value.numel() == len(node.key), node
            assert parent.value is not None, f"{node!r} is on the device but its parent is not"
            if node.lock_ref:
                protected += len(node.key)
            else:
                evictable += len(node.key)
            assert not self._is_device_leaf(node) or node in self._lru, f"{node!r} evictable but not queued"
            values.append(node.value)
        assert (evictable, protected) == (self._evictable, self._protected), (
            (evictable, protected),
            (self._evictable, self._protected),
        )
        total = evictable + protected
        if values:
            assert torch.cat(values).unique().numel() == total, "a slot is held twice"
        a = self._allocator
        assert a.num_free + total + running_only_slots == a.num_slots, (
            f"free {a.num_free} + tree {total} + running {running_only_slots} != {a.num_slots}"
        )

    def pretty_print(self) -> str:
        lines = []
        for ns, root in self._roots.items():
            lines.append(f"namespace {ns!r}")
            stack = [(c, 1) for c in reversed(list(root.children.values()))]
            while stack:
                node, depth = stack.pop()
                head = list(node.key[:8]) + (["..."] if len(node.key) > 8 else [])
                lines.append(f"{'  ' * depth}{head} {node!r}")
                stack.extend((c, depth + 1) for c in reversed(list(node.children.values())))
        lines.append(f"evictable={self._evictable} protected={self._protected}")
        out = "\n".join(lines)
        print(out)
        return out
