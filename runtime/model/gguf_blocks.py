"""GGUF quantized blocks <-> codes: what the loader reads as stored (`codes`), and the K-quant
blocks the `gguf` package cannot write (`quantize`: it has their dequantization only), for tests
and `python -m bench engine`'s q4k format.

Every type read here is w = q * scale + min per group with unsigned codes q, the scale and min
made in float32 exactly as gguf.quants' dequantization makes them (so `Int4Codes.dequantize`
equals it bit for bit):

- Q4_1 (w = d q + m) and Q4_K (256-weight super-blocks: fp16 d and dmin, 6-bit sc and m per
  sub-block of 32; w = (d sc) q - (dmin m)): 4-bit codes, groups of 32;
- Q5_0 (w = d (q - 16)), Q5_1 (w = d q + m), Q5_K (Q4_K with a fifth code bit): 5 bits, groups of 32;
- Q6_K (int8 sc per sub-block of 16, one fp16 d; w = (d sc) (q - 32)): 6 bits, groups of 16;
- Q8_0 (w = d q, q int8): as `Int8Codes`; in a decoder layer as 8-bit `Int4Codes` (q + 128).

Block layouts: llama.cpp's ggml-common.h, as gguf-py's quants.py unpacks them.
"""

from __future__ import annotations

import numpy as np
import torch
from gguf import GGMLQuantizationType as T

from runtime.model.quant_codes import Int4Codes, Int8Codes

QK_K = 256  # a K-quant super-block's weights

# type -> (bytes a block, weights a block)
BLOCKS = {
    T.Q4_1: (20, 32),
    T.Q5_0: (22, 32),
    T.Q5_1: (24, 32),
    T.Q8_0: (34, 32),
    T.Q4_K: (144, QK_K),
    T.Q5_K: (176, QK_K),
    T.Q6_K: (210, QK_K),
}
READ_TYPES = frozenset(BLOCKS)


def _f16(b: np.ndarray) -> np.ndarray:
    return b.copy().view(np.float16)[..., 0].astype(np.float32)


def _nibbles(qs: np.ndarray, run: int) -> np.ndarray:
    """[..., bytes] -> codes: each `run` bytes give `run` low nibbles then `run` high ones."""
    q = qs.reshape(*qs.shape[:-1], -1, 1, run) >> np.array([0, 4], dtype=np.uint8).reshape(1, 2, 1)
    return (q & 0x0F).reshape(*qs.shape[:-1], -1)


def _k_scales(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K's 12 bytes -> the 8 sub-blocks' 6-bit sc and m (gguf's Q4_K.get_scale_min)."""
    d, m, m_d = scales[..., 0:4], scales[..., 4:8], scales[..., 8:12]
    sc = np.concatenate([d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return sc, mn


def _unpack(kind, b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, int]:
    """blocks [rows, n, bytes] -> (codes [rows, n, weights], scale and min [rows, n, groups], group, bits)."""
    if kind == T.Q4_1:
        return _nibbles(b[..., 4:], 16), _f16(b[..., 0:2])[..., None], _f16(b[..., 2:4])[..., None], 32, 4
    if kind in (T.Q5_0, T.Q5_1):
        head = 2 if kind == T.Q5_0 else 4
        qh = b[..., head : head + 4].copy().view(np.uint32)  # [rows, n, 1]
        high = ((qh >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)
        q = _nibbles(b[..., head + 4 :], 16) | (high << 4)
        d = _f16(b[..., 0:2])[..., None]
        m = -16 * d if kind == T.Q5_0 else _f16(b[..., 2:4])[..., None]
        return q, d, m, 32, 5
    if kind == T.Q8_0:
        q = (b[..., 2:].copy().view(np.int8).astype(np.int16) + 128).astype(np.uint8)
        d = _f16(b[..., 0:2])[..., None]
        return q, d, -128 * d, 32, 8
    if kind in (T.Q4_K, T.Q5_K):
        d, dmin = _f16(b[..., 0:2]), _f16(b[..., 2:4])
        sc, mn = _k_scales(b[..., 4:16])
        if kind == T.Q4_K:
            q, bits = _nibbles(b[..., 16:], 32), 4
        else:
            qh = b[..., 16:48]
            high = (qh[..., None, :] >> np.arange(8, dtype=np.uint8).reshape(8, 1)) & 1  # [.., 8, 32]
            q, bits = _nibbles(b[..., 48:], 32) | (high.reshape(*qh.shape[:-1], -1) << 4), 5
        return q, d[..., None] * sc.astype(np.float32), -(dmin[..., None] * mn.astype(np.float32)), 32, bits
    if kind == T.Q6_K:
        ql, qh = b[..., 0:128], b[..., 128:192]
        sc = b[..., 192:208].copy().view(np.int8).astype(np.float32)
        d = _f16(b[..., 208:210])
        low = _nibbles(ql, 64)
        high = (qh.reshape(*qh.shape[:-1], 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(4, 1)) & 3
        q = low | (high.reshape(*qh.shape[:-1], -1) << 4)
        scale = d[..., None] * sc
        return q, scale, -32 * scale, 16, 6
    raise ValueError(f"GGUF block type {kind!r}: not read as codes (one of {sorted(t.name for t in READ_TYPES)})")


def unpack(kind, blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, int]:
    """One matrix's blocks, uint8 [rows, bytes of a row] -> (codes uint8 [rows, K], scales and mins
    float32 [rows, K / group], group, bits), numpy arrays (torch ops here would start an OpenMP team
    on the loading thread beside the engine's)."""
    size, _ = BLOCKS[kind]
    rows = blocks.shape[0]
    q, scale, mn, group, bits = _unpack(kind, np.ascontiguousarray(blocks).reshape(rows, -1, size))
    return (
        q.reshape(rows, -1).astype(np.uint8, copy=False),
        scale.reshape(rows, -1).astype(np.float32, copy=False),
        mn.reshape(rows, -1).astype(np.float32, copy=False),
        group,
        bits,
    )


def layer_codes(kind, blocks: np.ndarray, rows=None) -> Int4Codes:
    """A decoder layer's matrix as the q4 format's codes (every type: w = q * scale + min). `rows`:
    a function reordering each array's rows (the loader's rope unpermutation), or None."""
    q, scale, mn, group, bits = unpack(kind, blocks)
    zeros = mn + np.float32(8) * scale
    arrays = [q, scale, zeros, mn] if rows is None else [rows(a) for a in (q, scale, zeros, mn)]
    q, scale, zeros, mn = (torch.from_numpy(np.ascontiguousarray(a)) for a in arrays)
    return Int4Codes(q, scale, zeros, group, mn, bits)


def symmetric_codes(kind, blocks: np.ndarray) -> Int8Codes | None:
    """A logits-layer matrix (embedding, output) as `Int8Codes` (w = c * scale) where its type is
    symmetric (Q8_0, Q5_0, Q6_K), else None."""
    if kind not in (T.Q8_0, T.Q5_0, T.Q6_K):
        return None
    q, scale, _, group, bits = unpack(kind, blocks)
    codes = (q.astype(np.int16) - (1 << (bits - 1))).astype(np.int8)
    return Int8Codes(torch.from_numpy(codes), torch.from_numpy(np.ascontiguousarray(scale)), group)


# ---- writing K-quant blocks (tests, the bench's q4k model) ----


def _round(x: np.ndarray) -> np.ndarray:
    return np.floor(x + 0.5)


def _pack_k_scales(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """8 sub-blocks' 6-bit sc and m [.., 8] -> Q4_K's 12 bytes (the inverse of `_k_scales`)."""
    sc, mn = sc.astype(np.uint8), mn.astype(np.uint8)
    d = (sc[..., 0:4] & 0x3F) | ((sc[..., 4:8] >> 4) << 6)
    m = (mn[..., 0:4] & 0x3F) | ((mn[..., 4:8] >> 4) << 6)
    m_d = (sc[..., 4:8] & 0x0F) | ((mn[..., 4:8] & 0x0F) << 4)
    return np.concatenate([d, m, m_d], axis=-1)


def _pack_nibbles(q: np.ndarray, run: int) -> np.ndarray:
    """The inverse of `_nibbles`: codes 0..15 [.., n] -> bytes [.., n / 2]."""
    q = q.reshape(*q.shape[:-1], -1, 2, run)
    return (q[..., 0, :] | (q[..., 1, :] << 4)).reshape(*q.shape[:-3], -1)


def _quantize_k(x: np.ndarray, levels: int) -> tuple[np.ndarray, ...]:
    """Min/max per sub-block of 32 for Q4_K (levels 15) / Q5_K (31), w = (d sc) q - (dmin m): super-block
    d and dmin in fp16, 6-bit sc and m, codes from the rounded scales."""
    sub = x.reshape(*x.shape[:-1], 8, 32)
    lo = np.minimum(sub.min(-1), 0)
    scale = (sub.max(-1) - lo) / levels
    d = (scale.max(-1, keepdims=True) / 63).astype(np.float16).astype(np.float32)
    dmin = ((-lo).max(-1, keepdims=True) / 63).astype(np.float16).astype(np.float32)
    sc = np.clip(_round(np.divide(scale, d, out=np.zeros_like(scale), where=d > 0)), 0, 63)
    mn = np.clip(_round(np.divide(-lo, dmin, out=np.zeros_like(lo), where=dmin > 0)), 0, 63)
    step, offset = d * sc, dmin * mn
    q = _round(np.divide(sub + offset[..., None], step[..., None], out=np.zeros_like(sub), where=step[..., None] > 0))
    q = np.clip(q, 0, levels).astype(np.uint8).reshape(*x.shape[:-1], QK_K)
    return d, dmin, sc, mn, q


def quantize(w: np.ndarray, kind) -> np.ndarray:
    """float32 [rows, K] (K a multiple of 256) -> Q4_K, Q5_K or Q6_K blocks, uint8 [rows, bytes], which
    gguf.quants.dequantize reads back. Plain min/max rounding (not llama.cpp's search for the best
    scales): blocks of the real layout, not its quality."""
    rows, k = w.shape
    if kind not in (T.Q4_K, T.Q5_K, T.Q6_K) or k % QK_K:
        raise ValueError(f"quantize: Q4_K, Q5_K or Q6_K rows of a multiple of {QK_K} weights, not {kind!r} x {k}")
    x = np.asarray(w, dtype=np.float32).reshape(rows, k // QK_K, QK_K)
    if kind == T.Q6_K:
        sub = x.reshape(rows, -1, 16, 16)
        peak = np.take_along_axis(sub, np.abs(sub).argmax(-1)[..., None], -1)[..., 0]
        scale = peak / -32  # as Q5_0/Q6_K's reference: the largest weight lands on code -32
        d = (np.abs(scale).max(-1, keepdims=True) / 127).astype(np.float16).astype(np.float32)
        sc = np.clip(_round(np.divide(scale, d, out=np.zeros_like(scale), where=d > 0)), -127, 127)
        step = d * sc
        q = _round(np.divide(sub, step[..., None], out=np.zeros_like(sub), where=step[..., None] != 0))
        q = (np.clip(q, -32, 31) + 32).astype(np.uint8).reshape(rows, -1, 2, 4, 32)  # [.., half, quarter, l]
        ql = _pack_nibbles(q.reshape(rows, -1, QK_K) & 0x0F, 64)  # per half of 128: byte j codes j, 64 + j
        hi = q >> 4  # 2 bits: qh byte l of a half holds codes l, 32 + l, 64 + l, 96 + l
        qh = (hi[..., 0, :] | (hi[..., 1, :] << 2) | (hi[..., 2, :] << 4) | (hi[..., 3, :] << 6)).reshape(rows, -1, 64)
        blocks = [ql, qh, sc.astype(np.int8).view(np.uint8), d.astype(np.float16).view(np.uint8)]
    else:
        levels = 15 if kind == T.Q4_K else 31
        d, dmin, sc, mn, q = _quantize_k(x, levels)
        head = [d.astype(np.float16).view(np.uint8), dmin.astype(np.float16).view(np.uint8), _pack_k_scales(sc, mn)]
        if kind == T.Q4_K:
            blocks = [*head, _pack_nibbles(q, 32)]
        else:
            high = (q >> 4).reshape(rows, -1, 8, 32)
            qh = np.zeros(high.shape[:-2] + (32,), dtype=np.uint8)
            for i in range(8):
                qh |= high[..., i, :] << i
            blocks = [*head, qh, _pack_nibbles(q & 0x0F, 32)]
    return np.concatenate(blocks, axis=-1).reshape(rows, -1)
