"""Phi-3 / Phi-4-mini (folder, or GGUF arch `phi3`): fused `qkv_proj` and `gate_up_proj` (split
here into the decoder's q/k/v and gate/up, which it fuses again its own way), `longrope` rope scaling (runtime/model/rope.py) and, for
Phi-4-mini, partial rotary (`partial_rotary_factor` 0.75: rope on the first 3/4 of each head).

Partial rotary without a new kernel: the rope tables turn the pairs (j, j + head_dim/2), Hugging
Face's half-split layout over the whole head. Rope on the first `r` dims pairs (j, j + r/2) instead,
so the q and k rows of each head are reordered at load as [rot[:r/2], pass[:p/2], rot[r/2:],
pass[p/2:]]: each rotated pair (j, j + r/2) lands head_dim/2 apart, and the pass-through dims get
frequency 0 (cos 1, sin 0). q.k is a sum over dims, the same under one reordering of both, and v is
untouched, so attention's output is unchanged; every backend and fused kernel runs as it is.
A config.json `sliding_window` (Phi-3-mini-4k: 2047) windows every layer, as transformers' Phi3Attention does.
"""

from __future__ import annotations

import torch

from runtime.model.config import ModelLoadError
from runtime.model.families.family import Family, GGUFField, GGUFTensor, Weights
from runtime.model.families.llama import sliding_window_fields


def _config(hf: dict) -> dict:
    rope = dict(hf.get("rope_scaling") or hf.get("rope_parameters") or {})
    heads = int(hf["num_attention_heads"])
    head_dim = int(hf.get("head_dim") or int(hf["hidden_size"]) // heads)
    factor = float(hf.get("partial_rotary_factor") or rope.get("partial_rotary_factor") or 1.0)
    rotary_dim = int(head_dim * factor)
    if rotary_dim % 2 or (head_dim - rotary_dim) % 2 or rotary_dim <= 0:
        raise ModelLoadError(
            f"config.json: partial_rotary_factor {factor} gives {rotary_dim} of {head_dim} "
            "head dims: both parts must be even"
        )
    out: dict = {"rotary_dim": rotary_dim, **sliding_window_fields(hf)}  # Phi-3-mini-4k: 2047
    kind = rope.get("rope_type") or rope.get("type") or "default"
    if kind in ("su", "yarn"):  # Phi-3's early names for longrope (transformers' Phi3Config maps them too)
        kind = "longrope"
    if kind == "longrope":
        rope["rope_type"] = "longrope"
        rope.setdefault(
            "original_max_position_embeddings",
            int(hf.get("original_max_position_embeddings") or hf.get("max_position_embeddings", 4096)),
        )
        out["rope_scaling"] = rope
    return out


def _reorder_rows(w: torch.Tensor, heads: int, head_dim: int, rotary_dim: int) -> torch.Tensor:
    r, p = rotary_dim // 2, (head_dim - rotary_dim) // 2
    rot, rest = torch.arange(rotary_dim), torch.arange(rotary_dim, head_dim)
    order = torch.cat([rot[:r], rest[:p], rot[r:], rest[p:]])
    return w.reshape(heads, head_dim, *w.shape[1:])[:, order].reshape(w.shape)


def _weights(weights: Weights, cfg) -> Weights:
    out = {}
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    for name, w in weights.items():
        if name.endswith("self_attn.qkv_proj.weight"):
            base = name[: -len("qkv_proj.weight")]
            out[base + "q_proj.weight"], out[base + "k_proj.weight"], out[base + "v_proj.weight"] = w.split([q, kv, kv])
        elif name.endswith("mlp.gate_up_proj.weight"):
            base = name[: -len("gate_up_proj.weight")]
            out[base + "gate_proj.weight"], out[base + "up_proj.weight"] = w.chunk(2)  # gate first, as Phi3MLP
        else:
            out[name] = w
    if cfg.rotary_dim < cfg.head_dim:
        for name in list(out):
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                heads = cfg.num_heads if name.endswith("q_proj.weight") else cfg.num_kv_heads
                out[name] = _reorder_rows(out[name], heads, cfg.head_dim, cfg.rotary_dim)
    return out


def _gguf_config(field: GGUFField, tensor: GGUFTensor) -> dict:
    """llama.cpp's phi3 metadata: rotary dims, and longrope's factors as two global tensors with
    the original context and the attention factor as fields (convert_hf_to_gguf Phi3MiniModel)."""
    out: dict = {}
    window = field("attention.sliding_window", None)  # convert_hf_to_gguf Phi3MiniModel writes it
    if window:
        out["sliding_window"] = int(window)
    head_dim = int(field("embedding_length", 0)) // int(field("attention.head_count", 1))
    rot = field("rope.dimension_count", None)
    if rot is not None and head_dim and int(rot) != head_dim:
        out["partial_rotary_factor"] = int(rot) / head_dim
    long, short = tensor("rope_factors_long.weight"), tensor("rope_factors_short.weight")
    if long is not None and short is not None:
        orig = int(field("rope.scaling.original_context_length", field("context_length", 4096)))
        rope = {
            "rope_type": "longrope",
            "long_factor": long,
            "short_factor": short,
            "original_max_position_embeddings": orig,
        }
        attn = field("rope.scaling.attn_factor", None)
        if attn is not None:
            rope["attention_factor"] = float(attn)
        out.update(rope_scaling=rope, original_max_position_embeddings=orig)
    return out


PHI3 = Family(
    name="phi3",
    model_types=("phi3",),
    hf_architecture="Phi3ForCausalLM",
    gguf_arch="phi3",
    gguf_names={
        "blk.{i}.attn_qkv.weight": "model.layers.{i}.self_attn.qkv_proj.weight",
        "blk.{i}.ffn_up.weight": "model.layers.{i}.mlp.gate_up_proj.weight",  # gate and up, fused
    },
    config=_config,
    gguf_config=_gguf_config,
    weights=_weights,
)
