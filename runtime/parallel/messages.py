"""What rank 0 sends its workers over their pipes: the start-up settings (a `WorkerSpec`), the pool
size, then one message per pass.

A pass's `ForwardBatch` travels as numpy arrays and lists (plain pickling; torch's tensor pickling
in multiprocessing would pass shared-memory handles), and is rebuilt on the worker's device.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from runtime.engine_config import EngineConfig
from runtime.forward_batch import ForwardBatch
from runtime.model.config import ModelConfig

# pipe message kinds, rank 0 -> worker
POOL = "pool"  # ("pool", kv_pool_tokens): build the KV pool, then answer READY
PASS = "pass"  # ("pass", encoded batch): run one forward pass
STOP = "stop"  # ("stop", None): leave
# worker -> rank 0
UP = "up"  # ("up", None): started, joining the group
READY = "ready"  # ("ready", None): shard and pool built
FAILED = "failed"  # ("failed", one line): the worker could not start or run a pass, and exits


@dataclass
class WorkerSpec:
    """What a worker needs to build its shard (pickled into the spawned process)."""

    rank: int
    size: int
    port: int  # rank 0's TCP store
    config: EngineConfig
    model_dir: Path
    model_config: ModelConfig
    device: str  # this rank's device ("cpu", "cuda:1")
    dtype: str  # torch dtype name


def encode_batch(batch: ForwardBatch) -> dict:
    def arr(t: torch.Tensor) -> np.ndarray:
        return t.detach().cpu().numpy()

    return {
        "input_ids": arr(batch.input_ids),
        "positions": arr(batch.positions),
        "out_slots": arr(batch.out_slots),
        "extend_lens": list(batch.extend_lens),
        "seq_lens": list(batch.seq_lens),
        "slot_rows": [arr(r) for r in batch.slot_rows],
        "logits_index": arr(batch.logits_index),
        "prefix_groups": list(batch.prefix_groups),
    }


def decode_batch(msg: dict, device: torch.device) -> ForwardBatch:
    def dev(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(a).to(device)

    return ForwardBatch(
        input_ids=dev(msg["input_ids"]),
        positions=dev(msg["positions"]),
        out_slots=dev(msg["out_slots"]),
        extend_lens=msg["extend_lens"],
        seq_lens=msg["seq_lens"],
        slot_rows=[torch.from_numpy(a) for a in msg["slot_rows"]],  # host tensors, as the runner's
        logits_index=dev(msg["logits_index"]),
        prefix_groups=msg["prefix_groups"],
    )
