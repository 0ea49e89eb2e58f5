"""The process group of one tensor-parallel replica: gloo on CPU, NCCL on CUDA, made without
torch.distributed's global default group (an in-process engine can start, stop and start again,
and tests run several in one interpreter).

Rank 0 opens a TCP store on 127.0.0.1 (a free port) that the workers join. Collectives run only
inside a forward pass (workers wait for the next pass on their pipe, runtime/parallel/launch.py),
so the group's timeout bounds how long one pass may wait on a rank, never an idle server.
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

PASS_TIMEOUT = timedelta(seconds=120)  # the longest a collective waits on another rank
JOIN_TIMEOUT = timedelta(seconds=300)  # workers start Python and import torch before they join


def backend_for(device: torch.device) -> str:
    """NCCL between GPUs, gloo between CPU processes (the only one CI runs)."""
    return "nccl" if device.type == "cuda" else "gloo"


def open_store(size: int) -> dist.TCPStore:
    """Rank 0's rendezvous store on a free local port (`.port` tells the workers)."""
    return dist.TCPStore("127.0.0.1", 0, size, is_master=True, timeout=JOIN_TIMEOUT, wait_for_workers=False)


def join_store(port: int, size: int) -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", port, size, is_master=False, timeout=JOIN_TIMEOUT)


class TPGroup:
    """This rank's view of the group: the collectives a sharded model needs."""

    def __init__(self, store: dist.Store, rank: int, size: int, device: torch.device):
        self.rank, self.size, self.device = rank, size, device
        self.backend = backend_for(device)
        if self.backend == "nccl":
            opts = dist.ProcessGroupNCCL.Options()
            opts._timeout = PASS_TIMEOUT
            self.pg = dist.ProcessGroupNCCL(store, rank, size, opts)
        else:
            self.pg = _gloo(store, rank, size)

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        """Sum `t` over the ranks, in place (gloo sums bf16/fp16 through float32)."""
        if self.backend == "gloo" and t.dtype != torch.float32:
            wide = t.float()
            self.pg.allreduce([wide]).wait()
            return t.copy_(wide)
        self.pg.allreduce([t]).wait()
        return t

    def gather_columns(self, t: torch.Tensor) -> torch.Tensor:
        """Rank 0: every rank's `t` [rows, cols] side by side [rows, size * cols]; other ranks: `t`."""
        t = t.contiguous()
        opts = dist.GatherOptions()
        opts.rootRank = 0
        if self.rank != 0:
            self.pg.gather([], [t], opts).wait()
            return t
        parts = [torch.empty_like(t) for _ in range(self.size)]
        self.pg.gather([parts], [t], opts).wait()
        return torch.cat(parts, dim=1)


def _gloo(store: dist.Store, rank: int, size: int):
    """A gloo group on the loopback device (never the host's other interfaces)."""
    gloo = dist.ProcessGroupGloo
    opts = gloo._Options()
    opts._devices = [gloo.create_device(hostname="127.0.0.1")]
    opts._timeout = PASS_TIMEOUT
    return gloo(store, rank, size, opts)
