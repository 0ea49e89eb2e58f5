"""Rotary position embeddings, including the scaling variants Llama-family configs use."""

from __future__ import annotations

import math

import torch

from runtime.model_config import ModelConfig, ModelLoadError


def rope_inv_freq(cfg: ModelConfig) -> torch.Tensor:
    dim = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    scaling = cfg.rope_scaling or {}
    kind = scaling.get("rope_type") or scaling.get("type") or "default"
    if kind == "default":
        return inv_freq
    if kind == "linear":
        return inv_freq / float(scaling["factor"])
    if kind == "llama3":
        # Llama 3.1: keep high frequencies, divide low ones by `factor`, blend in between.
        factor = float(scaling["factor"])
        low = float(scaling.get("low_freq_factor", 1.0))
        high = float(scaling.get("high_freq_factor", 4.0))
        old_ctx = float(scaling.get("original_max_position_embeddings", 8192))
        wavelen = 2 * math.pi / inv_freq
        smooth = (old_ctx / wavelen - low) / (high - low)
        scaled = torch.where(wavelen > old_ctx / low, inv_freq / factor, inv_freq)
        mid = (wavelen <= old_ctx / low) & (wavelen >= old_ctx / high)
        return torch.where(mid, (1 - smooth) * inv_freq / factor + smooth * inv_freq, scaled)
    raise ModelLoadError(f"config.json: unsupported rope_scaling type {kind!r} (supported: default, linear, llama3)")


class RotaryEmbedding:
    """Precomputed cos/sin tables indexed by absolute position (Hugging Face half-split layout)."""

    def __init__(self, cfg: ModelConfig, max_positions: int, device: torch.device, dtype: torch.dtype):
        inv_freq = rope_inv_freq(cfg)
        t = torch.arange(max_positions, dtype=torch.float64)
        freqs = torch.outer(t, inv_freq)
        emb = torch.cat([freqs, freqs], dim=-1)
        self.cos = emb.cos().to(device=device, dtype=dtype)
        # rotate_half(x) * sin == swap_halves(x) * (sin with its first half negated): the sign is
        # folded into the table once, so a rotation is one op fewer (negation is exact: same values).
        half = emb.shape[-1] // 2
        self.sin_signed = torch.cat([-emb[:, :half].sin(), emb[:, half:].sin()], dim=-1).to(device=device, dtype=dtype)

    def tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and signed sin rows for `positions` [T], shaped [T, 1, D]: gathered once per pass."""
        return self.cos[positions].unsqueeze(1), self.sin_signed[positions].unsqueeze(1)

    @staticmethod
    def rotate(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
        """x: [T, heads, D] rotated by the tables of `tables` (Hugging Face half-split layout)."""
        half = x.shape[-1] // 2
        return x * cos + torch.cat([x[..., half:], x[..., :half]], dim=-1) * sin_signed

    def apply(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor):
        """q: [T, H, D], k: [T, KVH, D], positions: [T] -> rotated (q, k)."""
        cos, sin = self.tables(positions)
        return self.rotate(q, cos, sin), self.rotate(k, cos, sin)
