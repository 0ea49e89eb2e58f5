"""Token bitmask rows in xgrammar's layout (int32 [batch, ceil(vocab / 32)], bit j of word i
allowing token 32 * i + j), written the same way by both engines' matchers and the closing planner."""

from __future__ import annotations

from typing import Iterable

import numpy as np
import torch


def allow_only(bitmask: torch.Tensor, row: int, ids: Iterable[int] | torch.Tensor) -> None:
    """Set `bitmask[row]` to allow exactly `ids`."""
    words = np.zeros(bitmask.shape[-1], dtype=np.uint32)
    idx = np.fromiter(ids.tolist() if isinstance(ids, torch.Tensor) else ids, dtype=np.int64)
    np.bitwise_or.at(words, idx >> 5, np.left_shift(np.uint32(1), (idx & 31).astype(np.uint32)))
    bitmask[row] = torch.from_numpy(words.view(np.int32))
