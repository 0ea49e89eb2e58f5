"""Rotary position embeddings, including the scaling variants the families' configs use (linear,
Llama 3.x `llama3`, Phi-3 `longrope`, gpt-oss `yarn`) and partial rotary."""

from __future__ import annotations

import math

import torch

from runtime.model.config import ModelConfig, ModelLoadError


def rope_frequencies(cfg: ModelConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """(inverse frequencies, factors the cos/sin tables are scaled by), each [head_dim / 2]. Under
    partial rotary (`cfg.rotary_dim` < head_dim) the dims past rotary_dim / 2 get frequency 0 and
    factor 1: they pass through (runtime/model/families/phi3.py reorders q/k rows so they are the ones)."""
    inv_freq, attention_factor = _rotary_inv_freq(cfg, cfg.rotary_dim or cfg.head_dim)
    pad = cfg.head_dim // 2 - inv_freq.shape[0]
    scale = torch.cat([torch.full_like(inv_freq, attention_factor), inv_freq.new_ones(pad)])
    return torch.cat([inv_freq, inv_freq.new_zeros(pad)]), scale


def _rotary_inv_freq(cfg: ModelConfig, dim: int) -> tuple[torch.Tensor, float]:
    exponents = torch.arange(0, dim, 2, dtype=torch.float64) / dim
    inv_freq = 1.0 / (cfg.rope_theta**exponents)
    scaling = cfg.rope_scaling or {}
    kind = scaling.get("rope_type") or scaling.get("type") or "default"
    if kind == "default":
        return inv_freq, 1.0
    if kind == "linear":
        return inv_freq / float(scaling["factor"]), 1.0
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
        return torch.where(mid, (1 - smooth) * inv_freq / factor + smooth * inv_freq, scaled), 1.0
    if (
        kind == "rope_freqs"
    ):  # a Llama 3.x GGUF's per-frequency divisors (runtime/model/loader.py), as llama.cpp applies them
        factors = torch.tensor(scaling["freq_factors"], dtype=torch.float64)
        if factors.shape != inv_freq.shape:
            raise ModelLoadError(
                f"config.json: {factors.shape[0]} rope freq_factors, the rotary dims need {inv_freq.shape[0]}"
            )
        return inv_freq / factors, 1.0
    if kind == "longrope":
        # Phi-3 (transformers' _compute_longrope_parameters). Hugging Face switches short -> long
        # factors per forward once the sequence passes the original context; the KV cache here keeps
        # rotated keys, so the choice is made once, as llama.cpp does: long factors where the served
        # context (max_position_embeddings) is longer than the original one, short ones elsewhere.
        orig = int(scaling["original_max_position_embeddings"])
        factor = scaling.get("factor") or cfg.max_position_embeddings / orig
        attention_factor = scaling.get("attention_factor")
        if attention_factor is None:
            attention_factor = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(orig))
        ext = scaling["long_factor"] if cfg.max_position_embeddings > orig else scaling["short_factor"]
        ext = torch.tensor(ext, dtype=torch.float64)
        if ext.shape != inv_freq.shape:
            raise ModelLoadError(
                f"config.json: longrope factors have {ext.shape[0]} entries, the rotary dims need {inv_freq.shape[0]}"
            )
        return inv_freq / ext, float(attention_factor)
    if kind == "yarn":
        return _yarn(cfg, scaling, inv_freq, dim)
    raise ModelLoadError(
        f"config.json: unsupported rope_scaling type {kind!r} "
        "(supported: default, linear, llama3, longrope, rope_freqs, yarn)"
    )


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn(cfg: ModelConfig, scaling: dict, inv_freq: torch.Tensor, dim: int) -> tuple[torch.Tensor, float]:
    """YaRN (gpt-oss; transformers' _compute_yarn_parameters): frequencies blended between the
    original (high ones) and divided by `factor` (low ones) over a ramp of dims set by beta_fast /
    beta_slow rotations in the original context, the tables scaled by the attention factor."""
    orig = float(scaling["original_max_position_embeddings"])
    factor = scaling.get("factor") or cfg.max_position_embeddings / orig
    factor = float(factor)
    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
        if mscale and mscale_all:
            attention_factor = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all)
        else:
            attention_factor = _yarn_mscale(factor)
    beta_fast, beta_slow = float(scaling.get("beta_fast") or 32), float(scaling.get("beta_slow") or 1)

    def correction_dim(rotations: float) -> float:
        return dim * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(cfg.rope_theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # as transformers: no zero-width ramp
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    extrapolation = 1 - ramp  # the share of each frequency kept as it was
    return inv_freq / factor * ramp + inv_freq * extrapolation, float(attention_factor)


class RotaryEmbedding:
    """Precomputed cos/sin tables indexed by absolute position (Hugging Face half-split layout)."""

    def __init__(self, cfg: ModelConfig, max_positions: int, device: torch.device, dtype: torch.dtype):
        inv_freq, scale = rope_frequencies(cfg)
        t = torch.arange(max_positions, dtype=torch.float64)
        freqs = torch.outer(t, inv_freq)
        emb = torch.cat([freqs, freqs], dim=-1)
        scale = torch.cat([scale, scale])  # longrope's attention factor (1: exact, no change)
        self.cos = (emb.cos() * scale).to(device=device, dtype=dtype)
        # rotate_half(x) * sin == swap_halves(x) * (sin with its first half negated): the sign is
        # folded into the table once, so a rotation is one op fewer (negation is exact: same values).
        half = emb.shape[-1] // 2
        sin = torch.cat([-emb[:, :half].sin(), emb[:, half:].sin()], dim=-1) * scale
        self.sin_signed = sin.to(device=device, dtype=dtype)

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
