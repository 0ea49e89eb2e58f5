"""The per-rank weight-memory budget (`--rank-memory-budget-mb`): the bytes of weights one process
holds once its model (or its shard) is built, refused above the budget with the size that would fit.

Measured, not estimated: every tensor the model's embedding, norms, logits layer and decoder
layers hold (their linear layers' codes, scales and packed copies), each storage counted once (a
tied logits layer shares the embedding's). Rope tables and the KV pool are not weights.
"""

from __future__ import annotations

import torch

from runtime.model.config import ModelLoadError

MIB = 1 << 20


def held_weight_bytes(model) -> int:
    """Bytes of the distinct tensor storages the model's weights hold."""
    storages: dict[int, int] = {}
    for t in _tensors([model.embed, model.norm, model.lm_head, model.layers]):
        s = t.untyped_storage()
        storages[s.data_ptr()] = s.nbytes()
    return sum(storages.values())


def check_weight_budget(model, budget_mb: int | None, rank: int = 0, size: int = 1) -> None:
    """ModelLoadError where this rank's weights exceed `budget_mb` MiB (None: no budget)."""
    if budget_mb is None:
        return
    held = held_weight_bytes(model)
    if held <= budget_mb * MIB:
        return
    need = -(-held * size // (budget_mb * MIB))  # ranks of this rank's share that would fit, at least
    hint = next((n for n in (2, 4) if n >= need), None)
    fix = f"serve it with --tensor-parallel-size {hint}" if hint and hint > size else "raise the budget"
    where = f"rank {rank} of {size}" if size > 1 else "one process"
    raise ModelLoadError(
        f"--rank-memory-budget-mb {budget_mb}: the weights need {held / MIB:.1f} MiB on {where}; {fix}"
    )


def _tensors(obj, depth: int = 0):
    """Tensors reachable from `obj` through lists and the runtime's own objects (not torch's)."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif depth < 8 and isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v, depth + 1)
    elif depth < 8 and type(obj).__module__.startswith("runtime.") and hasattr(obj, "__dict__"):
        for v in vars(obj).values():
            yield from _tensors(v, depth + 1)
