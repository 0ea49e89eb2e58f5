"""What the lower tiers know of one radix node: its host slots, its disk page hashes, its hits.

Attached to `TreeNode.tier` by the tiered cache (`hiradix_cache.py`), which splits it when the
tree cuts the node (the tree's `on_split` hook), so the tiers never need to subclass the tree.
"""

from __future__ import annotations

import torch


class TierRecord:
    __slots__ = ("page_size", "host", "hashes", "hits")

    def __init__(self, page_size: int):
        self.page_size = page_size
        self.host: torch.Tensor | None = None  # host slots, one per token; None = not in the host tier
        self.hashes: list[bytes] | None = None  # disk page hashes of the node's pages (computed lazily)
        self.hits = 0  # admissions that used the node (write_through_selective)

    def split(self, n: int) -> TierRecord:
        """Cut after `n` tokens (whole pages): returns the head's record, keeps the tail's."""
        head = TierRecord(self.page_size)
        head.hits = self.hits
        if self.host is not None:
            head.host, self.host = self.host[:n], self.host[n:]
        if self.hashes is not None:
            p = n // self.page_size
            head.hashes, self.hashes = self.hashes[:p], self.hashes[p:]
        return head


def record(node, page_size: int) -> TierRecord:
    """The node's tier record, attached on first use."""
    if node.tier is None:
        node.tier = TierRecord(page_size)
    return node.tier


def host_slots(node) -> torch.Tensor | None:
    return None if node.tier is None else node.tier.host
