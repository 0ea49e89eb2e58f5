"""Least-recently-used order over tree nodes whose access time only grows, without scanning the tree.

A heap of `(time, id, node)` entries with lazy keys: an entry's time is never later than its
node's `last_access` (touching a node only makes it later), so when the popped entry is current
its node is truly the oldest; a stale one is pushed again with the current time. The owner says
which nodes may be taken (`is_candidate`) and pushes a node whenever it may have become one
(created, unlocked, lost its last child, ...); a popped node that is not a candidate is dropped
until it is pushed again. Each node has at most one entry, so the heap never outgrows the tree.
"""

from __future__ import annotations

import heapq
from typing import Any, Callable


class LRUQueue:
    def __init__(self, is_candidate: Callable[[Any], bool]):
        self.is_candidate = is_candidate
        self._heap: list[tuple[int, int, Any]] = []
        self._queued: set[Any] = set()  # nodes with an entry in the heap
        self.visited = 0  # entries looked at by `pop` (cumulative): what eviction costs

    def __len__(self) -> int:
        return len(self._heap)

    def __contains__(self, node: Any) -> bool:
        return node in self._queued

    def push(self, node: Any) -> None:
        if node not in self._queued:
            self._queued.add(node)
            heapq.heappush(self._heap, (node.last_access, node.id, node))

    def pop(self) -> Any | None:
        """The least recently used candidate, removed from the queue; None when there is none."""
        heap = self._heap
        while heap:
            t, _, node = heap[0]
            self.visited += 1
            if not self.is_candidate(node):
                heapq.heappop(heap)
                self._queued.discard(node)
            elif node.last_access != t:  # touched since it was pushed: re-key, keep looking
                heapq.heapreplace(heap, (node.last_access, node.id, node))
            else:
                heapq.heappop(heap)
                self._queued.discard(node)
                return node
        return None

    def clear(self) -> None:
        self._heap.clear()
        self._queued.clear()
