"""Rank 0's side of a tensor-parallel replica: it starts the workers, joins them in one group, sends
each pass's batch and watches that they live.

The scheduler, radix cache, grammar masks and sampling stay here; workers only mirror the forward
pass on their shards. Workers are spawned processes (daemons, so they end with this interpreter
too) that wait on a pipe between passes. Anything that goes wrong during a split pass leaves the
group out of step (a rank may wait in a collective the others never reach), so it is fatal:
`RankLost`, which the engine answers by failing the requests in flight and stopping.
"""

from __future__ import annotations

import logging
import multiprocessing
from pathlib import Path
from typing import Callable

import torch

from runtime.engine_config import EngineConfig
from runtime.forward_batch import ForwardBatch
from runtime.model.config import ModelConfig, ModelLoadError
from runtime.parallel.group import JOIN_TIMEOUT, TPGroup, open_store
from runtime.parallel.messages import FAILED, PASS, POOL, READY, STOP, WorkerSpec, encode_batch
from runtime.parallel.sharding import check_shardable

log = logging.getLogger("jumpgate.tp")

STOP_WAIT_S = 10.0  # a worker not gone this long after the stop message is terminated


class RankLost(RuntimeError):
    """A rank died or a split pass failed: nothing more can run in this group."""

    fatal = True  # runtime/engine/engine.py stops the engine on it


class TensorParallel:
    """Ranks 1..N-1 of this replica, started here; this process is rank 0."""

    def __init__(self, cfg: EngineConfig, model_dir: Path, mc: ModelConfig, device: torch.device, dtype: torch.dtype):
        size = cfg.tensor_parallel_size
        check_shardable(mc, size, device)  # before any process starts
        self.size = size
        self.procs: list[multiprocessing.Process] = []
        self.conns = []
        self._closed = False
        store = open_store(size)
        ctx = multiprocessing.get_context("spawn")  # never fork a process that holds torch threads
        try:
            for rank in range(1, size):
                mine, theirs = ctx.Pipe()
                where = f"cuda:{rank}" if device.type == "cuda" else str(device)
                spec = WorkerSpec(rank, size, store.port, cfg, model_dir, mc, where, str(dtype).removeprefix("torch."))
                from runtime.parallel.worker import worker_main

                proc = ctx.Process(target=worker_main, args=(theirs, spec), name=f"jumpgate-tp{rank}", daemon=True)
                proc.start()
                theirs.close()
                self.procs.append(proc)
                self.conns.append(mine)
            self.group = TPGroup(store, 0, size, device)  # waits until every worker joined
        except BaseException:
            self.close()
            raise
        self._store = store  # the workers' rendezvous; kept while the group lives

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def start(self, kv_pool_tokens: int) -> None:
        """Tell the workers the KV pool size and wait until each has its shard and pool (or
        raise the first one's failure as a ModelLoadError)."""
        for conn in self.conns:
            try:
                conn.send((POOL, kv_pool_tokens))
            except OSError:  # it already failed: its message is read below
                pass
        for rank, (conn, proc) in enumerate(zip(self.conns, self.procs), start=1):
            if not conn.poll(JOIN_TIMEOUT.total_seconds()):
                raise ModelLoadError(f"tensor-parallel rank {rank}: not ready within {JOIN_TIMEOUT}")
            try:
                kind, line = conn.recv()
            except EOFError:
                raise ModelLoadError(f"tensor-parallel rank {rank}: exited at start (code {proc.exitcode})") from None
            if kind == FAILED:
                raise ModelLoadError(line)
            if kind != READY:
                raise ModelLoadError(f"tensor-parallel rank {rank}: unexpected start-up message {kind!r}")

    def run_pass(self, batch: ForwardBatch, forward: Callable[[], torch.Tensor]) -> torch.Tensor:
        """Send `batch` to every worker, then run rank 0's part (`forward`); any failure: RankLost."""
        self._check_alive()
        try:
            message = (PASS, encode_batch(batch))
            for conn in self.conns:
                conn.send(message)
            return forward()
        except Exception as e:
            raise RankLost(self._why(e)) from e

    def _check_alive(self) -> None:
        if self._closed:
            raise RankLost("tensor-parallel group closed")
        if not all(proc.is_alive() for proc in self.procs):
            raise RankLost(self._why(None))

    def _why(self, error: Exception | None) -> str:
        """The first dead worker and what it said, else the error of this rank's pass."""
        for rank, (conn, proc) in enumerate(zip(self.conns, self.procs), start=1):
            if proc.is_alive():
                continue
            said = ""
            try:
                if conn.poll(0):
                    kind, line = conn.recv()
                    said = f": {line}" if kind == FAILED else ""
            except (EOFError, OSError):
                pass
            return f"tensor-parallel rank {rank} exited (code {proc.exitcode}){said}"
        return f"tensor-parallel pass failed on rank 0: {type(error).__name__}: {error}"

    def close(self) -> None:
        """Stop every worker and wait for it (terminated, then killed, if it does not leave)."""
        if self._closed:
            return
        self._closed = True
        for conn in self.conns:
            try:
                conn.send((STOP, None))
            except OSError:
                pass
        for proc in self.procs:
            proc.join(STOP_WAIT_S)
            if proc.is_alive():
                log.warning("tensor-parallel worker %s did not stop; terminating it", proc.pid)
                proc.terminate()
                proc.join(STOP_WAIT_S)
            if proc.is_alive():
                proc.kill()
                proc.join()
        for conn in self.conns:
            conn.close()
