"""What the Triton kernel tests share: where they run (a GPU, or the Triton interpreter on CPU) and a
tiny model on that device."""

from __future__ import annotations

import torch

from bench.harness.device_cases import build_model
from bench.probes.device_check import SMOKE
from runtime.attention import triton_interpreter_enabled
from runtime.kvcache.pool import KVPool

CPU = torch.device("cpu")
ON_GPU = torch.cuda.is_available() and not triton_interpreter_enabled()
DEV = torch.device("cuda") if ON_GPU else CPU


def tiny_model(device=DEV):
    cfg, model, _ = build_model(SMOKE["model"], device, torch.float32, max_positions=128)
    return model, KVPool(cfg.num_layers, 96, cfg.num_kv_heads, cfg.head_dim, torch.float32, device)
