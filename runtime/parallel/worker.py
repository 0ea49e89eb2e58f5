"""A tensor-parallel worker (ranks 1..N-1): joins the group, builds its shard and KV pool, then runs
every pass rank 0 sends until told to stop.

It exits when rank 0 goes: a stop message, or the pipe's end of file when rank 0's process is gone
(killed included), so no worker outlives its engine. A failure is sent back as one line before
the worker exits; rank 0 then fails the requests in flight (runtime/parallel/launch.py).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from multiprocessing.connection import Connection

import torch

from runtime.parallel.messages import FAILED, PASS, POOL, READY, STOP, UP, WorkerSpec, decode_batch

log = logging.getLogger("jumpgate.tp")


def main() -> None:
    """`python -m runtime.parallel.worker FD`: FD is this worker's end of rank 0's socket pair."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C reaches rank 0, which stops us in turn
    conn = Connection(int(sys.argv[1]))
    try:
        spec = conn.recv()
    except (EOFError, OSError):
        return
    worker_main(conn, spec)


def worker_main(conn, spec: WorkerSpec) -> None:
    """Join, build, serve; every way out closes the pipe."""
    try:
        conn.send((UP, None))
        state = _start(conn, spec)
        if state is not None:
            _serve(conn, *state)
    except (EOFError, OSError, KeyboardInterrupt):  # rank 0 is gone: leave quietly
        pass
    except Exception as e:  # a pass that failed: tell rank 0 the reason, then exit
        _tell(conn, f"tensor-parallel rank {spec.rank}: {type(e).__name__}: {e}")
        raise SystemExit(1) from e
    finally:
        conn.close()


def _start(conn, spec: WorkerSpec):
    from runtime.attention import make_attention_backend
    from runtime.kvcache.pool import KVPool
    from runtime.model.config import ModelLoadError
    from runtime.parallel.budget import check_weight_budget
    from runtime.parallel.group import TPGroup, join_store
    from runtime.parallel.model import load_sharded_model

    cfg, mc = spec.config, spec.model_config
    torch.set_num_threads(cfg.num_threads or max(1, (os.cpu_count() or 1) // spec.size))
    device, dtype = torch.device(spec.device), getattr(torch, spec.dtype)
    if device.type == "cuda":
        torch.cuda.set_device(device)  # NCCL's collectives run on the current device
    group = TPGroup(join_store(spec.port, spec.size), spec.rank, spec.size, device)
    try:
        attn = make_attention_backend(cfg.attention_backend, device)
        model = load_sharded_model(spec.model_dir, mc, cfg.weights, device, dtype, group)
        check_weight_budget(model, cfg.rank_memory_budget_mb, spec.rank, spec.size)
    except (ModelLoadError, ValueError, OSError) as e:
        _tell(conn, str(e))
        return None
    kind, pool_tokens = conn.recv()
    if kind != POOL:
        return None
    kv = KVPool(
        mc.num_layers,
        pool_tokens,
        mc.num_kv_heads // spec.size,
        mc.head_dim,
        dtype,
        device,
        head_major=attn.kv_head_major,
    )
    conn.send((READY, None))
    return model, kv, attn, device


def _serve(conn, model, kv, attn, device) -> None:
    while True:
        kind, payload = conn.recv()
        if kind == STOP:
            return
        if kind == PASS:
            model.forward(decode_batch(payload, device), kv, attn)


def _tell(conn, line: str) -> None:
    try:
        conn.send((FAILED, line))
    except OSError:
        pass


if __name__ == "__main__":
    main()
