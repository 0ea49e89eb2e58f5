"""Window-layer KV slots: sliding-window layers keep only their window in memory.

A model with sliding-window layers (Gemma 3, gpt-oss, Mistral v0.1) needs a window layer's K/V of
a position only while some later token still sees it: a token at position i sees j > i - window.
The design (as SGLang's SWATokenToKVPoolAllocator, without its second tree):

* Every position still takes a full slot: the request's row, the radix tree and the full layers'
  K/V use it, unchanged. A window layer keeps its K/V in a smaller pool of window slots, tied to
  full slots by `WindowSlots.map` (full slot -> window slot; the window pool's scratch row where
  it has none, so a pass's translated rows always read valid memory, which the window masks out).
* `TiedSlotAllocator` hands out a full slot with a window slot and frees both together, so every
  path that frees slots (rejected drafts, truncation, duplicates, eviction) frees both.
* A window slot is released early once its position is out of every window layer's reach, for
  good: `CacheManager.trim_window` (runtime/kvcache/cache_manager.py) releases a running request's
  own positions before `len - window + 1 - TRIM_SLACK`, and those of tree nodes only it has locked.
  Under pressure the cache manager releases the window KV of unlocked tree nodes (tombstones)
  before it evicts whole prefixes.
* Exact reuse: a match, or a rollback, keeps only the longest prefix whose last `window - 1`
  positions still have window KV (`exact_length`); the rest is computed again.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from runtime.forward_batch import ForwardBatch
from runtime.kvcache.pool import SlotAllocator

# Window KV kept beyond the window: a rewound value or a jump-forward rollback within this many
# tokens needs no recompute. Trimming runs once this many more positions (TRIM_EVERY) fell out.
TRIM_SLACK = 64
TRIM_EVERY = 32
WINDOW_POOL_SHARE = 4  # the default window pool: this fraction (1/4) of the full pool


def default_window_slots(full_slots: int, need: int) -> int:
    """A quarter of the full pool (a long context keeps its window only, so it needs far less; many
    short requests at once wait for window slots sooner), at least what one request needs."""
    return max(need, full_slots // WINDOW_POOL_SHARE)


def min_window_slots(window: int, pass_tokens: int) -> int:
    """What one request needs at once: its window with the slack, and one pass's new tokens."""
    return window + TRIM_SLACK + TRIM_EVERY + pass_tokens


class WindowSlots:
    def __init__(self, num_full_slots: int, num_slots: int, window: int):
        if window < 1:
            raise ValueError("window must be >= 1")
        self.window = window
        self.allocator = SlotAllocator(num_slots)
        self.none = num_slots  # the window pool's scratch row: "no window KV"
        self.map = torch.full((num_full_slots + 1,), num_slots, dtype=torch.int64)

    @property
    def num_slots(self) -> int:
        return self.allocator.num_slots

    def present(self, full_slots: torch.Tensor) -> torch.Tensor:
        """Which of `full_slots` still have window KV."""
        return self.map[full_slots] != self.none

    def translate(self, full_slots: torch.Tensor) -> torch.Tensor:
        """The window slots of `full_slots` (the scratch row where released)."""
        return self.map[full_slots]

    def attach(self, full_slots: torch.Tensor, window_slots: torch.Tensor) -> None:
        self.map[full_slots] = window_slots

    def release(self, full_slots: torch.Tensor) -> int:
        """Free the window slots of `full_slots` (those that still have one); returns how many."""
        full_slots = full_slots.reshape(-1)
        w = self.map[full_slots]
        held = w != self.none
        n = int(held.sum())
        if n:
            self.allocator.free(w[held])
            self.map[full_slots[held]] = self.none
        return n

    def adopt(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """`src[i]` and `dst[i]` hold the same position's KV (a duplicate the cache had already):
        where `dst` has no window KV left and `src` has, it moves to `dst` (then freeing `src`
        frees only its full slot)."""
        move = ~self.present(dst) & self.present(src)
        if bool(move.any()):
            self.map[dst[move]] = self.map[src[move]]
            self.map[src[move]] = self.none

    def reset(self) -> None:
        self.allocator.reset()
        self.map.fill_(self.none)

    def check_invariant(self, full: SlotAllocator) -> None:
        """Every window slot is free or held by exactly one full slot, and no free full slot holds one."""
        held = self.map[:-1][self.map[:-1] != self.none]
        free = self.allocator.num_free
        assert free + held.numel() == self.num_slots, f"window: free {free} + held {held.numel()} != {self.num_slots}"
        assert held.unique().numel() == held.numel(), "window: a window slot is held twice"
        free_full = torch.tensor(full.free_slots(), dtype=torch.int64)
        assert not self.present(free_full).any(), "window: a free full slot holds a window slot"

    def exact_length(self, full_slots: torch.Tensor, length: int, page_size: int = 1) -> int:
        """The longest prefix <= `length` (whole pages) whose next token finds all the window KV
        it sees: positions [L - window + 1, L) still present. `full_slots[i]` is position i's."""
        if length <= 0:
            return 0
        has = self.present(full_slots[:length])
        if bool(has.all()):
            return length - length % page_size
        pos = torch.arange(length)
        last_missing = torch.cummax(torch.where(has, -1, pos), dim=0).values
        run = pos - last_missing  # present positions ending at each one (itself included)
        ends = pos + 1  # a prefix of length e ends at position e - 1
        ok = (run >= torch.clamp(ends, max=self.window - 1)) & (ends % page_size == 0)
        found = ok.nonzero()
        return int(found[-1]) + 1 if found.numel() else 0


class TiedSlotAllocator(SlotAllocator):
    """Full slots, each handed out with a window slot and freed with it (module docstring)."""

    def __init__(self, num_slots: int, window: WindowSlots):
        super().__init__(num_slots)
        self.window = window

    @property
    def room(self) -> int:
        return min(self.num_free, self.window.allocator.num_free)

    def alloc(self, n: int) -> torch.Tensor | None:
        if n > self.room:
            return None
        out = super().alloc(n)
        self.window.attach(out, self.window.allocator.alloc(n))
        return out

    def free(self, slots: torch.Tensor) -> None:
        super().free(slots)
        self.window.release(slots)

    def reset(self) -> None:
        super().reset()
        self.window.reset()


def window_batch(batch: ForwardBatch, window: WindowSlots) -> ForwardBatch:
    """The pass as the window layers see it: the same tokens over their window slots."""
    out = window.translate(batch.out_slots.cpu()).to(batch.out_slots.device)
    return replace(batch, out_slots=out, slot_rows=[window.translate(s) for s in batch.slot_rows])
