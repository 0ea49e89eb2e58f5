"""Rank 0's side of a tensor-parallel replica: it starts the workers, joins them in one group, sends
each pass's batch and watches that they live.

The scheduler, radix cache, grammar masks and sampling stay here; workers only mirror the forward
pass on their shards. Workers are `python -m runtime.parallel.worker` processes (not multiprocessing's
spawn, which re-imports the caller's main module: an engine started from stdin or a notebook could
not start them) that wait on a socket pipe between passes and leave at its end. Anything that goes wrong during a split pass leaves the
group out of step (a rank may wait in a collective the others never reach), so it is fatal:
`RankLost`, which the engine answers by failing the requests in flight and stopping.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Callable

import torch

from runtime.engine_config import EngineConfig
from runtime.forward_batch import ForwardBatch
from runtime.model.config import ModelConfig, ModelLoadError
from runtime.parallel.group import JOIN_TIMEOUT, TPGroup, open_store
from runtime.parallel.messages import FAILED, PASS, POOL, READY, STOP, UP, WorkerSpec, encode_batch
from runtime.parallel.sharding import check_shardable

log = logging.getLogger("jumpgate.tp")

STOP_WAIT_S = 10.0  # a worker not gone this long after the stop message is terminated
WHY_WAIT_S = 2.0  # after a failed pass, how long a worker's exit may take to show


class RankLost(RuntimeError):
    """A rank died or a split pass failed: nothing more can run in this group."""

    fatal = True  # runtime/engine/engine.py stops the engine on it


class TensorParallel:
    """Ranks 1..N-1 of this replica, started here; this process is rank 0."""

    def __init__(self, cfg: EngineConfig, model_dir: Path, mc: ModelConfig, device: torch.device, dtype: torch.dtype):
        size = cfg.tensor_parallel_size
        check_shardable(mc, size, device, cfg.weights)  # before any process starts
        self.size = size
        self.procs: list[Worker] = []
        self.conns: list[Connection] = []
        self._closed = False
        store = open_store(size)
        try:
            for rank in range(1, size):
                where = f"cuda:{rank}" if device.type == "cuda" else str(device)
                spec = WorkerSpec(rank, size, store.port, cfg, model_dir, mc, where, str(dtype).removeprefix("torch."))
                proc, conn = Worker.start(spec)
                self.procs.append(proc)
                self.conns.append(conn)
            self._wait_up()
            self.group = TPGroup(store, 0, size, device)  # waits until every worker joined
        except BaseException:
            self.close()
            raise
        self._store = store  # the workers' rendezvous; kept while the group lives

    def _wait_up(self) -> None:
        """Each worker's first word (it imported the runtime and is joining the group), so one that
        cannot even start fails the start at once instead of the group's join timing out."""
        deadline = time.monotonic() + JOIN_TIMEOUT.total_seconds()
        for rank, (conn, proc) in enumerate(zip(self.conns, self.procs), start=1):
            while not conn.poll(0.1):
                if not proc.is_alive():
                    raise ModelLoadError(f"tensor-parallel rank {rank}: exited at start (code {proc.exitcode})")
                if time.monotonic() > deadline:
                    raise ModelLoadError(f"tensor-parallel rank {rank}: not started within {JOIN_TIMEOUT}")
            try:
                kind, _ = conn.recv()
            except EOFError:
                raise ModelLoadError(f"tensor-parallel rank {rank}: exited at start (code {proc.exitcode})") from None
            if kind != UP:
                raise ModelLoadError(f"tensor-parallel rank {rank}: unexpected start-up message {kind!r}")

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
        """The first dead worker and what it said, else the error of this rank's pass. A collective
        sees a killed peer's socket close a moment before its exit can be read: wait that moment."""
        deadline = time.monotonic() + (WHY_WAIT_S if error is not None else 0)
        while time.monotonic() < deadline and all(proc.is_alive() for proc in self.procs):
            time.sleep(0.05)
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


class Worker:
    """One worker process and its liveness (a Popen with the few calls the launcher makes)."""

    def __init__(self, popen: subprocess.Popen):
        self.popen = popen

    @classmethod
    def start(cls, spec: WorkerSpec) -> tuple[Worker, Connection]:
        """Start `python -m runtime.parallel.worker FD` with one end of a socket pair as FD; send it `spec`."""
        mine, theirs = socket.socketpair()
        root = str(Path(__file__).resolve().parents[2])  # the folder `runtime` is imported from
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
        cmd = [sys.executable, "-m", "runtime.parallel.worker", str(theirs.fileno())]
        popen = subprocess.Popen(cmd, pass_fds=[theirs.fileno()], env=env, stdin=subprocess.DEVNULL)
        theirs.close()
        conn = Connection(mine.detach())
        conn.send(spec)
        return cls(popen), conn

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def exitcode(self) -> int | None:
        return self.popen.poll()

    def is_alive(self) -> bool:
        return self.popen.poll() is None

    def join(self, timeout: float | None = None) -> None:
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pass

    def terminate(self) -> None:
        self.popen.terminate()

    def kill(self) -> None:
        self.popen.kill()
