"""A GGUF's quantized blocks as the loader reads them (runtime/model/loader.py's `read_gguf_codes`) and the
linear layers take them (runtime/model/linear.py): codes, scales and offsets, before any kernel layout."""

from __future__ import annotations

from dataclasses import dataclass

import torch

INT4_GROUP = 32  # GGUF Q4_0/Q4_1/Q8_0 block size, and a group size the int4 kernels take


@dataclass
class Int4Codes:
    """Group-wise asymmetric codes before packing: codes [N, K] in 0..15, scales and zeros [N, K / group];
    w = (codes - 8) * scale + zero. `mins` [N, K / group]: the blocks' own offsets, w = codes * scale + min
    (Q4_1's m, which zero = m + 8 scale rounds); the float32 kernel takes them.
    A decoder layer's GGUF codes of every other type too (runtime/model/gguf_blocks.py: Q4_K; and
    wider, `bits` 5 to 8, codes in 0..2^bits - 1: Q5_0, Q5_1, Q5_K, Q6_K in groups of 16, Q8_0), so
    that the q4 format takes each layer's codes as stored: 4-bit ones run the int4 kernels, wider
    ones the int8 kernel (runtime/model/linear.py's `make_q4_linear`)."""

    codes: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor
    group: int = INT4_GROUP
    mins: torch.Tensor | None = None
    bits: int = 4

    @classmethod
    def from_q4_1(cls, d: torch.Tensor, m: torch.Tensor, codes: torch.Tensor) -> Int4Codes:
        """GGUF Q4_1 blocks (w = d * q + m): the same codes, scale = d, zero = m + 8d."""
        return cls(codes, d.float(), m.float() + 8 * d.float(), INT4_GROUP, m.float())

    @classmethod
    def quantize(cls, weight: torch.Tensor, group: int = INT4_GROUP) -> Int4Codes:
        """Min/max quantization per group of `group` inputs (Q4_1's rule), for float-only sources."""
        n, k = weight.shape
        w = weight.float().reshape(n, k // group, group)
        lo, hi = w.amin(-1), w.amax(-1)
        scale = ((hi - lo) / 15).clamp(min=1e-12)
        codes = torch.round((w - lo[..., None]) / scale[..., None]).clamp(0, 15).to(torch.uint8).reshape(n, k)
        return cls(codes, scale, lo + 8 * scale, group, lo)

    @staticmethod
    def cat(parts: list[Int4Codes]) -> Int4Codes:
        """Row-stacked weights with the same inputs (fused QKV, gate/up). Parts of different groups or
        widths (a Q4_K_M file's Q4_K q and k beside a Q6_K v) are stacked in the finest group and the
        widest codes, each group's scale and min repeated: the same weights."""
        group, bits = min(p.group for p in parts), max(p.bits for p in parts)
        parts = [p.regrouped(group) for p in parts]
        mins = None if any(p.mins is None for p in parts) else torch.cat([p.mins for p in parts])
        if mins is None and bits > 4:
            mins = torch.cat([p.offsets() for p in parts])
        return Int4Codes(
            torch.cat([p.codes for p in parts]),
            torch.cat([p.scales for p in parts]),
            torch.cat([p.zeros for p in parts]),
            group,
            mins,
            bits,
        )

    def regrouped(self, group: int) -> Int4Codes:
        """The same weights in groups of `group` (a divisor of this one's): scales and mins repeated."""
        if group == self.group:
            return self
        if self.group % group:
            raise ValueError(f"codes in groups of {self.group} cannot be regrouped by {group}")
        r = self.group // group
        mins = None if self.mins is None else self.mins.repeat_interleave(r, 1)
        return Int4Codes(
            self.codes, self.scales.repeat_interleave(r, 1), self.zeros.repeat_interleave(r, 1), group, mins, self.bits
        )

    def offsets(self) -> torch.Tensor:
        """m of w = codes * scale + m: the blocks' own where known."""
        return self.mins if self.mins is not None else self.zeros - 8 * self.scales

    def dequantize(self) -> torch.Tensor:
        """The float32 weights; from the blocks' own mins, q * scale + min, exactly as gguf's
        dequantization computes them (the products are exact: an fp16 scale times sc and q)."""
        n, k = self.codes.shape
        q = self.codes.float().reshape(n, k // self.group, self.group)
        if self.mins is not None:
            return (q * self.scales[..., None] + self.mins[..., None]).reshape(n, k)
        return ((q - 8) * self.scales[..., None] + self.zeros[..., None]).reshape(n, k)


@dataclass
class Int8Codes:
    """GGUF Q8_0 blocks: codes [N, K] int8, scales [N, K / group]; w = codes * scale. Also a logits
    layer's other symmetric blocks (Q5_0; Q6_K in groups of 16), runtime/model/gguf_blocks.py."""

    codes: torch.Tensor
    scales: torch.Tensor
    group: int = INT4_GROUP

    @classmethod
    def quantize(cls, weight: torch.Tensor, group: int = INT4_GROUP) -> Int8Codes:
        """Symmetric int8 per group of `group` inputs (Q8_0's rule: scale = max |w| / 127)."""
        n, k = weight.shape
        w = weight.float().reshape(n, k // group, group)
        scale = (w.abs().amax(-1) / 127).clamp(min=1e-12)
        codes = torch.round(w / scale[..., None]).clamp(-127, 127).to(torch.int8).reshape(n, k)
        return cls(codes, scale, group)

    def dequantize(self) -> torch.Tensor:
        n, k = self.codes.shape
        return (self.codes.float().reshape(n, k // self.group, self.group) * self.scales[..., None]).reshape(n, k)
