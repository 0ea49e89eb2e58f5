"""The L2 tier: a host-memory KV pool with the same per-layer layout as the device pool.

Anchor: SGLang `mem_cache/memory_pool_host.py`. Host slots are owned like device slots (see
`prefix_cache.py`): each one is free (in this pool's allocator) or held by exactly one radix node
of the `HiRadixCache`; requests never hold host slots. On CUDA the tensors are pinned (faster copies);
copies are blocking, so a slot can be reused as soon as a copy returns.

KV moves between pools as one tensor `[2, num_layers, n, kv_heads, head_dim]` (K then V): the
unit that `gather_kv` returns, `scatter_kv` writes and a disk page stores.
"""

from __future__ import annotations

import torch

from runtime.kvcache.pool import KVPool, SlotAllocator


class HostKVPool:
    """Per-layer K and V tensors `[num_slots, kv_heads, head_dim]` in host memory."""

    def __init__(
        self,
        num_layers: int,
        num_slots: int,
        kv_heads: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        pin_memory: bool = False,
    ):
        self.num_layers = num_layers
        self.num_slots = num_slots
        self.kv_heads = kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.device = torch.device("cpu")
        pin = pin_memory and torch.cuda.is_available()
        shape = (num_slots, kv_heads, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, pin_memory=pin) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, pin_memory=pin) for _ in range(num_layers)]
        self.allocator = SlotAllocator(num_slots)

    @classmethod
    def like(cls, device_pool: KVPool, num_slots: int) -> HostKVPool:
        return cls(
            device_pool.num_layers,
            num_slots,
            device_pool.kv_heads,
            device_pool.head_dim,
            device_pool.dtype,
            pin_memory=device_pool.device.type == "cuda",
        )


def gather_kv(pool: KVPool | HostKVPool, slots: torch.Tensor) -> torch.Tensor:
    """A CPU copy `[2, L, n, H, D]` of the KV in `slots` (the copy outlives the slots)."""
    idx = slots.to(pool.device)
    out = torch.stack([torch.stack([layer[idx] for layer in side]) for side in (pool.k, pool.v)])
    return out if out.device.type == "cpu" else out.to("cpu")


def scatter_kv(pool: KVPool | HostKVPool, slots: torch.Tensor, data: torch.Tensor) -> None:
    """Write `data` `[2, L, n, H, D]` into `slots` of `pool`, every layer."""
    idx = slots.to(pool.device)
    data = data.to(pool.device)
    for layer in range(pool.num_layers):
        pool.k[layer][idx] = data[0, layer].to(pool.dtype)
        pool.v[layer][idx] = data[1, layer].to(pool.dtype)


def copy_kv(
    src: KVPool | HostKVPool, src_slots: torch.Tensor, dst: KVPool | HostKVPool, dst_slots: torch.Tensor
) -> None:
    """Copy KV between two pools (device → host on demotion, host → device on a load)."""
    s_idx, d_idx = src_slots.to(src.device), dst_slots.to(dst.device)
    for layer in range(src.num_layers):
        dst.k[layer][d_idx] = src.k[layer][s_idx].to(dst.device)
        dst.v[layer][d_idx] = src.v[layer][s_idx].to(dst.device)
