"""Token bitmask rows in xgrammar's layout (int32 [batch, ceil(vocab / 32)], bit j of word i
allowing token 32 * i + j), written the same way by both engines' matchers and the closing planner."""

from __future__ import annotations

from typing import Iterable

import numpy as np
import torch

_INT32 = torch.int32  # (a module global: ~30 ns less than torch.int32 per call)


def allow_only(bitmask: torch.Tensor, row: int, ids: Iterable[int] | torch.Tensor) -> None:
    """Set `bitmask[row]` to allow exactly `ids`."""
    words = np.zeros(bitmask.shape[-1], dtype=np.uint32)
    idx = np.fromiter(ids.tolist() if isinstance(ids, torch.Tensor) else ids, dtype=np.int64)
    np.bitwise_or.at(words, idx >> 5, np.left_shift(np.uint32(1), (idx & 31).astype(np.uint32)))
    bitmask[row] = torch.from_numpy(words.view(np.int32))


def row_address(bitmask: torch.Tensor, row: int) -> tuple[int, int]:
    """(address, byte size) of `bitmask[row]`, for an engine that writes the row in place
    (llguidance's `unsafe_compute_mask_ptr`). The checks are those of `llguidance.torch.
    fill_next_token_bitmask` (int32, CPU, 2-D, contiguous, `row` in range, negative counting from
    the end) without its `bitmask[row]` view, which alone cost ~1.7 us of a ~7 us mask. The
    tensor last checked is remembered with its address and shape: a batch's rows, and the next
    step's, are written into the same tensor, and only a change of either (a resize) can move
    or shrink what was checked, so they are compared at every call and the rest only on a change."""
    global _checked
    checked_tensor, checked_ptr, checked_shape = _checked
    ptr, shape = bitmask.data_ptr(), bitmask.shape
    if checked_tensor is not bitmask or ptr != checked_ptr or shape != checked_shape:
        if bitmask.dtype is not _INT32 or not bitmask.is_cpu or len(shape) != 2 or not bitmask.is_contiguous():
            raise ValueError("a token bitmask must be a contiguous 2-D int32 CPU tensor")
        _checked = (bitmask, ptr, shape)
    rows, words = shape
    if row < 0:
        row += rows
    if not 0 <= row < rows:
        raise IndexError(f"bitmask row {row} out of range for {rows} rows")
    return ptr + 4 * words * row, 4 * words


# (tensor, data_ptr, shape) of the bitmask row_address last validated; one tuple, replaced whole,
# so a thread reads a consistent one
_checked: tuple = (None, 0, None)


def is_allowed(words: np.ndarray | torch.Tensor, token_id: int | None) -> bool:
    """Whether the mask row `words` (uint32 or int32 words) allows `token_id` (None: no token)."""
    return token_id is not None and bool((int(words[token_id >> 5]) >> (token_id & 31)) & 1)


def allowed_among(words: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """The ids among `ids` whose bit is set in the mask row `words` (uint32)."""
    return ids[(words[ids >> 5] >> (ids & 31).astype(np.uint32)) & 1 != 0]


def allowed_ids(words: np.ndarray) -> np.ndarray:
    """Every id allowed by the mask row `words` (uint32); unpacks only the words that allow any."""
    nonzero = np.flatnonzero(words)
    bits = np.unpackbits(words[nonzero].view(np.uint8).reshape(-1, 4), axis=1, bitorder="little")
    rows, cols = np.nonzero(bits)
    return nonzero[rows] * 32 + cols
