"""Gemma 3, text (`model_type: gemma3_text`, Gemma3ForCausalLM; GGUF arch `gemma3`): the shared decoder with

- RMSNorms that scale by (1 + w): the stored weights plus one, made here once at load (in float32, as
  Gemma3RMSNorm computes them); llama.cpp's converter writes them already shifted, so a GGUF's are not;
- a norm on the attention's output and one on the MLP's output before each residual add
  (`post_attention_layernorm`, `post_feedforward_layernorm`), and the MLP's input norm named
  `pre_feedforward_layernorm`: renamed to the decoder's `attn_output_norm`, `mlp_output_norm` and
  `post_attention_layernorm` (the decoder's name for the norm before the MLP);
- q/k RMSNorm per head; scores scaled by `query_pre_attn_scalar`^-1/2 instead of head_dim^-1/2,
  folded into q_norm's weights (q's scale passes through rope unchanged: rope is linear), so every
  attention backend runs its usual head_dim^-1/2;
- a GeLU-tanh MLP, the embeddings times sqrt(hidden_size), the logits soft-capped where the config
  has `final_logit_softcapping`;
- sliding-window layers (`layer_types`, or the older `sliding_window_pattern`: every 6th layer
  global) attending the last `sliding_window` positions, with rope base `rope_local_base_freq`
  (transformers >= 5: `rope_parameters.sliding_attention`) and no rope scaling; the global layers
  take `rope_theta` and `rope_scaling` (linear x8 in the 4B-27B models).

Attention-logit soft-capping (Gemma 2's) and bidirectional attention are refused.
"""

from __future__ import annotations

import math

from runtime.model.config import ModelLoadError
from runtime.model.families.family import Family, GGUFField, GGUFTensor, Weights

LAYER_TYPES = ("sliding_attention", "full_attention")
# Gemma3TextConfig's defaults, for a config.json that leaves them out
DEFAULTS = {"rms_norm_eps": 1e-6, "head_dim": 256, "query_pre_attn_scalar": 256, "sliding_window": 4096}


def _layer_types(hf: dict) -> list[str]:
    layers = int(hf["num_hidden_layers"])
    types = hf.get("layer_types")
    if types is None:  # transformers < 4.53: every `sliding_window_pattern`-th layer is global
        pattern = int(hf.get("sliding_window_pattern") or 6)
        types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)]
    bad = sorted({t for t in types if t not in LAYER_TYPES})
    if len(types) != layers or bad:
        raise ModelLoadError(
            f"config.json: layer_types must name {layers} layers, each one of {', '.join(LAYER_TYPES)}"
            + (f" (not {', '.join(map(repr, bad))})" if bad else "")
        )
    return list(types)


def _rope(hf: dict) -> tuple[float, dict | None, float]:
    """(global rope base, global rope scaling or None, local rope base)."""
    params = hf.get("rope_parameters") or {}
    if "full_attention" in params or "sliding_attention" in params:  # transformers >= 5: one per layer type
        full = dict(params.get("full_attention") or {})
        local = dict(params.get("sliding_attention") or {})
        if (local.get("rope_type") or "default") != "default":
            raise ModelLoadError(
                f"config.json: rope_parameters.sliding_attention rope_type {local['rope_type']!r} is not "
                "supported (Gemma 3's local layers take the default rope)"
            )
        kind = full.get("rope_type") or full.get("type") or "default"
        return (
            float(full.get("rope_theta", 1e6)),
            full if kind != "default" else None,
            float(local.get("rope_theta", 1e4)),
        )
    scaling = hf.get("rope_scaling")
    if scaling and (scaling.get("rope_type") or scaling.get("type") or "default") == "default":
        scaling = None
    return float(hf.get("rope_theta", 1e6)), scaling, float(hf.get("rope_local_base_freq", 1e4))


def _config(hf: dict) -> dict:
    if hf.get("attn_logit_softcapping"):
        raise ModelLoadError("config.json: attn_logit_softcapping is not supported (no attention-score soft-capping)")
    if hf.get("use_bidirectional_attention"):
        raise ModelLoadError("config.json: use_bidirectional_attention true is not supported (causal attention only)")
    types = _layer_types(hf)
    window = int(hf.get("sliding_window") or DEFAULTS["sliding_window"])
    if window <= 0:
        raise ModelLoadError(f"config.json: sliding_window must be > 0, not {window}")
    theta, scaling, local_theta = _rope(hf)
    cap = hf.get("final_logit_softcapping")
    return {
        "qk_norm": True,
        "attention_bias": bool(hf.get("attention_bias", False)),
        "rms_norm_eps": float(hf.get("rms_norm_eps", DEFAULTS["rms_norm_eps"])),
        "head_dim": int(hf.get("head_dim") or DEFAULTS["head_dim"]),
        "tie_word_embeddings": bool(hf.get("tie_word_embeddings", True)),
        "layer_windows": tuple(window if t == "sliding_attention" else 0 for t in types),
        "rope_theta": theta,
        "rope_scaling": scaling,
        "local_rope_theta": local_theta,
        "hidden_act": hf.get("hidden_activation") or hf.get("hidden_act") or "gelu_pytorch_tanh",
        "embed_scale": math.sqrt(int(hf["hidden_size"])),
        "sandwich_norms": True,
        "norm_weight_offset": 0.0 if hf.get(GGUF_SHIFTED) else 1.0,
        "query_pre_attn_scalar": float(hf.get("query_pre_attn_scalar") or DEFAULTS["query_pre_attn_scalar"]),
        "final_logit_softcapping": float(cap) if cap else None,
    }


# Gemma's layer norm names -> the decoder's (order matters: post_attention_layernorm is renamed first)
_RENAMES = (
    (".post_attention_layernorm.", ".attn_output_norm."),
    (".pre_feedforward_layernorm.", ".post_attention_layernorm."),
    (".post_feedforward_layernorm.", ".mlp_output_norm."),
)
GGUF_SHIFTED = "gguf_norms_shifted"  # a converted GGUF's config.json field: its norms already hold 1 + w


def _weights(weights: Weights, cfg) -> Weights:
    q_scale = math.sqrt(cfg.head_dim / cfg.query_pre_attn_scalar) if cfg.query_pre_attn_scalar else 1.0
    out = {}
    for name, w in weights.items():
        if name.endswith("norm.weight"):
            w = w.float() + cfg.norm_weight_offset
            if name.endswith("self_attn.q_norm.weight") and q_scale != 1.0:
                w = w * q_scale
        for old, new in _RENAMES:
            if old in name:
                name = name.replace(old, new)
                break
        out[name] = w
    return out


def _gguf_config(field: GGUFField, _tensor: GGUFTensor) -> dict:
    """llama.cpp's gemma3 metadata (convert_hf_to_gguf Gemma3Model) as config.json fields."""
    out: dict = {
        "sliding_window": int(field("attention.sliding_window", DEFAULTS["sliding_window"])),
        "rope_local_base_freq": 10000.0,  # llama.cpp hard-codes it for gemma3
        "final_logit_softcapping": field("final_logit_softcapping", None),
        "sliding_window_pattern": 6,  # llama.cpp's for gemma3
        "hidden_activation": "gelu_pytorch_tanh",
        GGUF_SHIFTED: True,
    }
    key_len = field("attention.key_length", None)
    if key_len is not None:
        # llama.cpp scales scores by key_length^-1/2, but by (hidden / heads)^-1/2 for the 27B model,
        # which it tells by its layer count (62), as its query_pre_attn_scalar is 168 = 5376 / 32
        heads = int(field("attention.head_count", 1))
        big = int(field("block_count", 0)) == 62
        out["query_pre_attn_scalar"] = int(field("embedding_length", 0)) // heads if big else int(key_len)
    # the global layers' linear rope scaling is read as every family's (runtime/model/loader.py)
    return out


GEMMA3 = Family(
    name="gemma3",
    model_types=("gemma3_text",),
    hf_architecture="Gemma3ForCausalLM",
    gguf_arch="gemma3",
    gguf_names={
        "blk.{i}.attn_q_norm.weight": "model.layers.{i}.self_attn.q_norm.weight",
        "blk.{i}.attn_k_norm.weight": "model.layers.{i}.self_attn.k_norm.weight",
        "blk.{i}.post_attention_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
        "blk.{i}.ffn_norm.weight": "model.layers.{i}.pre_feedforward_layernorm.weight",
        "blk.{i}.post_ffw_norm.weight": "model.layers.{i}.post_feedforward_layernorm.weight",
    },
    config=_config,
    gguf_config=_gguf_config,
    weights=_weights,
)
