"""A GGUF's quantized blocks as the loader reads them (runtime/model/loader.py's `read_gguf_codes`) and the
linear layers take them (runtime/model/linear.py): codes, scales and offsets, before any kernel layout."""

from __future__ import annotations

from dataclasses import dataclass

import torch

INT4_GROUP = 32  # GGUF Q4_0/Q4_1/Q8_0 block size, and a group size the int4 kernels take


@dataclass
class Int4Codes:
    """Group-wise asymmetric int4 before packing: codes [N, K] in 0..15, scales and zeros [N, K / group];
    w = (codes - 8) * scale + zero. `mins` [N, K / group]: the blocks' own offsets, w = codes * scale + min
    (Q4_1's m, which zero = m + 8 scale rounds); the float32 kernel takes them."""

    codes: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor
    group: int = INT4_GROUP
    mins: torch.Tensor | None = None

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
        """Row-stacked weights with the same inputs (fused QKV, gate/up)."""
        mins = None if any(p.mins is None for p in parts) else torch.cat([p.mins for p in parts])
        return Int4Codes(
            torch.cat([p.codes for p in parts]),
            torch.cat([p.scales for p in parts]),
            torch.cat([p.zeros for p in parts]),
            parts[0].group,
            mins,
        )

    def offsets(self) -> torch.Tensor:
        """m of w = codes * scale + m: the blocks' own where known."""
        return self.mins if self.mins is not None else self.zeros - 8 * self.scales

    def dequantize(self) -> torch.Tensor:
        n, k = self.codes.shape
        w = (self.codes.float().reshape(n, k // self.group, self.group) - 8) * self.scales[..., None]
        return (w + self.zeros[..., None]).reshape(n, k)


@dataclass
class Int8Codes:
    """GGUF Q8_0 blocks: codes [N, K] int8, scales [N, K / 32]; w = codes * scale."""

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
