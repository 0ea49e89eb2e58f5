"""Token-slot KV storage: per-layer K/V tensors indexed by slot, a slot allocator, and the
request-to-token table that maps each running request's positions to slots.

Requests never own copies of KV: a request owns slot indices, and the radix cache can take
ownership of them when the request finishes (see `prefix_cache.py` for the contract).
"""

from __future__ import annotations

import torch


class SlotAllocator:
    """Free-list over `num_slots` token slots. Slots are int64 indices into the KV tensors."""

    def __init__(self, num_slots: int):
        if num_slots < 1:
            raise ValueError("num_slots must be >= 1")
        self.num_slots = num_slots
        self._free = torch.arange(num_slots, dtype=torch.int64)
        self._num_free = num_slots

    @property
    def num_free(self) -> int:
        return self._num_free

    @property
    def room(self) -> int:
        """Tokens one `alloc` can take now (a tied allocator also counts its window slots)."""
        return self._num_free

    def free_slots(self) -> list[int]:
        """The free slots (a copy; for accounting checks)."""
        return self._free[: self._num_free].tolist()

    def alloc(self, n: int) -> torch.Tensor | None:
        """Take `n` free slots, or None if fewer are free (the caller evicts and retries)."""
        if n > self._num_free:
            return None
        start = self._num_free - n
        out = self._free[start : self._num_free].clone()
        self._num_free = start
        return out

    def free(self, slots: torch.Tensor) -> None:
        n = int(slots.numel())
        if n == 0:
            return
        if self._num_free + n > self.num_slots:
            raise RuntimeError("slot double free: more slots freed than the pool holds")
        self._free[self._num_free : self._num_free + n] = slots.reshape(-1).to(torch.int64)
        self._num_free += n

    def reset(self) -> None:
        self._free = torch.arange(self.num_slots, dtype=torch.int64)
        self._num_free = self.num_slots


class KVPool:
    """Per-layer K and V tensors of shape [num_slots + 1, kv_heads, head_dim].

    The last row (`scratch_slot`) is never handed out: padded rows of a CUDA-graph decode batch
    write their K/V there, so padding can never touch a slot that a request or the cache owns.

    `head_major`: each layer's buffer is [kv_heads, num_slots + 1, head_dim], seen through a
    transposed view with the same [slot, head, dim] indexing. Attention reads one KV head of
    consecutive slots at a time; head-major those are one run of memory instead of every
    kv_heads-th piece of it, which the cpu kernel reads markedly faster (docs/perf-log.md).
    """

    def __init__(
        self,
        num_layers: int,
        num_slots: int,
        kv_heads: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        head_major: bool = False,
        layer_windows: tuple[int, ...] = (),
        window_slots: int = 0,
    ):
        """`window_slots` > 0 (with `layer_windows`): the window layers keep their K/V in that many
        window slots, tied to the full slots (runtime/kvcache/window_pool.py)."""
        self.num_layers = num_layers
        self.num_slots = num_slots
        self.kv_heads = kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.device = torch.device(device)
        self.scratch_slot = num_slots
        rows = num_slots + 1
        self.head_major = head_major

        def layer(rows: int) -> torch.Tensor:
            if head_major:
                return torch.zeros(kv_heads, rows, head_dim, dtype=dtype, device=self.device).transpose(0, 1)
            return torch.zeros(rows, kv_heads, head_dim, dtype=dtype, device=self.device)

        self.window = None  # WindowSlots where the window layers have their own pool
        windowed = [bool(w) for w in layer_windows] if window_slots > 0 else [False] * num_layers
        if any(windowed):
            from runtime.kvcache.window_pool import TiedSlotAllocator, WindowSlots

            self.window = WindowSlots(num_slots, window_slots, max(layer_windows))
            self.allocator: SlotAllocator = TiedSlotAllocator(num_slots, self.window)
        else:
            self.allocator = SlotAllocator(num_slots)
        self.windowed = windowed
        sizes = [window_slots + 1 if w else rows for w in windowed]
        self.k = [layer(n) for n in sizes]
        self.v = [layer(n) for n in sizes]

    @staticmethod
    def bytes_per_token(num_layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        return 2 * num_layers * kv_heads * head_dim * torch.tensor([], dtype=dtype).element_size()

    def kv_bytes(self) -> dict[str, int]:
        """Bytes of K/V held by the full layers and by the window layers (for stats and benches)."""
        out = {"full": 0, "window": 0}
        for i, (k, v) in enumerate(zip(self.k, self.v)):
            out["window" if self.windowed[i] else "full"] += k.numel() * k.element_size() + v.numel() * v.element_size()
        return out

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k[layer][slots] = k.to(self.dtype)
        self.v[layer][slots] = v.to(self.dtype)


class ReqToTokenTable:
    """Rows of slot indices, one row per running request: row[i] = slot of position i."""

    def __init__(self, max_requests: int, max_context: int, device: torch.device | str = "cpu"):
        self.max_context = max_context
        self.table = torch.zeros(max_requests, max_context, dtype=torch.int64, device=device)
        self._free_rows = list(range(max_requests - 1, -1, -1))

    @property
    def num_free_rows(self) -> int:
        return len(self._free_rows)

    def alloc_row(self) -> int | None:
        return self._free_rows.pop() if self._free_rows else None

    def free_row(self, row: int) -> None:
        self._free_rows.append(row)

    def write(self, row: int, start: int, slots: torch.Tensor) -> None:
        self.table[row, start : start + slots.numel()] = slots

    def slots(self, row: int, length: int) -> torch.Tensor:
        return self.table[row, :length]
