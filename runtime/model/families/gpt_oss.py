"""gpt-oss (`model_type: gpt_oss`, GptOssForCausalLM; GGUF arch `gpt-oss`): the shared decoder with

- attention sinks: a learned logit per query head (`self_attn.sinks`) that joins each softmax's
  denominator with no value, passed to the attention backend per layer (runtime/attention/base.py);
- sliding-window and full layers alternating (`layer_types`; by default even layers windowed),
  the window `sliding_window` positions; q/k/v and o_proj biases (`attention_bias`);
- YaRN rope (`rope_scaling` / `rope_parameters` of type yarn; runtime/model/rope.py);
- routed experts in every layer (runtime/model/moe.py): a router with a bias whose top-k logits are
  softmaxed alone, experts with biases whose gate is a clamped SwiGLU (`swiglu_limit`, alpha
  `swiglu_alpha`). transformers keeps each layer's experts stacked and transposed
  (`mlp.experts.gate_up_proj` [E, hidden, 2I] with gate and up columns interleaved,
  `down_proj` [E, I, hidden], and their `_bias`); they are split here into per-expert gate, up and
  down layers. A GGUF stacks them apart (`ffn_{gate,up,down}_exps`, [E, rows, cols]), as llama.cpp's
  converter writes them.

MXFP4 checkpoints (the released weights' `quantization_config`, `_blocks` / `_scales` tensors) are
refused: a folder written by transformers' save_pretrained from a dequantized model loads.
"""

from __future__ import annotations

import re

from runtime.model.config import ModelLoadError
from runtime.model.families.family import Family, GGUFField, GGUFTensor, Weights
from runtime.model.moe import check_experts, split_stacked_experts

LAYER_TYPES = ("sliding_attention", "full_attention")
# GptOssConfig's defaults, for a config.json that leaves them out
DEFAULT_ROPE = {
    "rope_type": "yarn",
    "factor": 32.0,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": False,
    "original_max_position_embeddings": 4096,
}
DEFAULTS = {"rope_theta": 150000.0, "sliding_window": 128, "swiglu_limit": 7.0, "swiglu_alpha": 1.702}


def _layer_types(hf: dict) -> list[str]:
    layers = int(hf["num_hidden_layers"])
    types = hf.get("layer_types") or ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(layers)]
    bad = sorted({t for t in types if t not in LAYER_TYPES})
    if len(types) != layers or bad:
        raise ModelLoadError(
            f"config.json: layer_types must name {layers} layers, each one of {', '.join(LAYER_TYPES)}"
            + (f" (not {', '.join(map(repr, bad))})" if bad else "")
        )
    return list(types)


def _rope(hf: dict) -> tuple[float, dict | None]:
    params = hf.get("rope_parameters") or hf.get("rope_scaling") or DEFAULT_ROPE
    theta = float(hf.get("rope_theta") or params.get("rope_theta") or DEFAULTS["rope_theta"])
    kind = params.get("rope_type") or params.get("type") or "default"
    return theta, None if kind == "default" else dict(params)


def _config(hf: dict) -> dict:
    quant = hf.get("quantization_config")
    if quant:
        raise ModelLoadError(
            f"config.json: quantization_config {quant.get('quant_method', quant)!r} is not supported "
            "(gpt-oss's MXFP4 experts are not read; save the model dequantized, or use a GGUF)"
        )
    window = int(hf.get("sliding_window") or DEFAULTS["sliding_window"])
    if window <= 0:
        raise ModelLoadError(f"config.json: sliding_window must be > 0, not {window}")
    theta, scaling = _rope(hf)
    limit = float(hf.get("swiglu_limit") or DEFAULTS["swiglu_limit"])
    if limit <= 0:
        raise ModelLoadError(f"config.json: swiglu_limit must be > 0, not {limit}")
    return check_experts(
        {
            "num_experts": int(hf.get("num_local_experts") or hf.get("num_experts") or 0),
            "experts_per_token": int(hf["num_experts_per_tok"]),
            "moe_intermediate_size": int(hf["intermediate_size"]),
            "norm_topk_prob": False,  # the top-k logits are softmaxed alone: their weights sum to 1
        }
    ) | {
        "moe_softmax_after_topk": True,
        "swiglu_limit": limit,
        "swiglu_alpha": float(hf.get("swiglu_alpha") or DEFAULTS["swiglu_alpha"]),
        "attention_sinks": True,
        "attention_bias": bool(hf.get("attention_bias", True)),
        "layer_windows": tuple(window if t == "sliding_attention" else 0 for t in _layer_types(hf)),
        "rope_theta": theta,
        "rope_scaling": scaling,
        "head_dim": int(hf.get("head_dim") or 64),
        "tie_word_embeddings": bool(hf.get("tie_word_embeddings", False)),
    }


def _gguf_config(field: GGUFField, _tensor: GGUFTensor) -> dict:
    """llama.cpp's gpt-oss metadata (convert_hf_to_gguf GptOssModel) as config.json fields."""
    out: dict = {
        "num_local_experts": int(field("expert_count", 0)),
        "num_experts_per_tok": int(field("expert_used_count", 0)),
        "intermediate_size": int(field("expert_feed_forward_length", 0)),
        "sliding_window": int(field("attention.sliding_window", DEFAULTS["sliding_window"])),
        "rope_theta": float(field("rope.freq_base", DEFAULTS["rope_theta"])),
    }
    kind = field("rope.scaling.type")
    if kind in (None, "yarn"):  # the reference's YaRN (not truncated), with the file's factor and context
        out["rope_scaling"] = {
            **DEFAULT_ROPE,
            "factor": float(field("rope.scaling.factor", DEFAULT_ROPE["factor"])),
            "original_max_position_embeddings": int(
                field("rope.scaling.original_context_length", DEFAULT_ROPE["original_max_position_embeddings"])
            ),
        }
    return out


_STACKED = re.compile(r"^(.*\.mlp\.experts)\.(gate_up_proj|down_proj)(_bias)?$")
_SPLIT_BIAS = re.compile(r"^(.*\.mlp\.experts)\.(gate_proj|up_proj|down_proj)\.bias$")  # a GGUF's, [E, rows]


def _weights(weights: Weights, _cfg) -> Weights:
    out = {}
    for name, w in weights.items():
        if name.endswith((".weight", ".bias")) and ".mlp.router." in name:
            out[name.replace(".mlp.router.", ".mlp.gate.")] = w
            continue
        m, b = _STACKED.match(name), _SPLIT_BIAS.match(name)
        if m is not None:  # transformers' stacked experts: x @ W per expert, gate/up columns interleaved
            base, kind, bias = m.groups()
            for e, we in enumerate(w.unbind(0)):
                if kind == "gate_up_proj" and bias:
                    out[f"{base}.{e}.gate_proj.bias"], out[f"{base}.{e}.up_proj.bias"] = we[0::2], we[1::2]
                elif kind == "gate_up_proj":
                    out[f"{base}.{e}.gate_proj.weight"] = we[:, 0::2].t().contiguous()
                    out[f"{base}.{e}.up_proj.weight"] = we[:, 1::2].t().contiguous()
                elif bias:
                    out[f"{base}.{e}.down_proj.bias"] = we
                else:
                    out[f"{base}.{e}.down_proj.weight"] = we.t().contiguous()
        elif b is not None:
            for e, we in enumerate(w.unbind(0)):
                out[f"{b[1]}.{e}.{b[2]}.bias"] = we
        else:
            out[name] = w
    return split_stacked_experts(out)  # a GGUF's ffn_*_exps weights, [E, rows, cols]


GPT_OSS = Family(
    name="gpt_oss",
    model_types=("gpt_oss",),
    hf_architecture="GptOssForCausalLM",
    gguf_arch="gpt-oss",
    gguf_experts=True,
    gguf_names={
        "blk.{i}.post_attention_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
        "blk.{i}.attn_output.bias": "model.layers.{i}.self_attn.o_proj.bias",
        "blk.{i}.attn_sinks.weight": "model.layers.{i}.self_attn.sinks",
        "blk.{i}.ffn_gate_inp.weight": "model.layers.{i}.mlp.router.weight",
        "blk.{i}.ffn_gate_inp.bias": "model.layers.{i}.mlp.router.bias",
        "blk.{i}.ffn_gate_exps.weight": "model.layers.{i}.mlp.experts.gate_proj.weight",
        "blk.{i}.ffn_up_exps.weight": "model.layers.{i}.mlp.experts.up_proj.weight",
        "blk.{i}.ffn_down_exps.weight": "model.layers.{i}.mlp.experts.down_proj.weight",
        "blk.{i}.ffn_gate_exps.bias": "model.layers.{i}.mlp.experts.gate_proj.bias",
        "blk.{i}.ffn_up_exps.bias": "model.layers.{i}.mlp.experts.up_proj.bias",
        "blk.{i}.ffn_down_exps.bias": "model.layers.{i}.mlp.experts.down_proj.bias",
    },
    config=_config,
    gguf_config=_gguf_config,
    weights=_weights,
)
