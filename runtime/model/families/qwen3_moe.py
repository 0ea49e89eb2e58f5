"""Qwen3-MoE (`model_type: qwen3_moe`; GGUF arch `qwen3moe`): Qwen3's attention (q/k RMSNorm) with
routed experts in place of the dense MLP (runtime/model/moe.py): `num_experts` experts of width
`moe_intermediate_size`, the top `num_experts_per_tok` per token, renormalized where
`norm_topk_prob` (the released models; transformers' default is off). Layers in `mlp_only_layers`
or off the `decoder_sparse_step` keep a dense MLP of `intermediate_size`. llama.cpp always
renormalizes for this arch, so a GGUF reads as `norm_topk_prob: true`. Sliding-window layers
(`use_sliding_window`, off in the released models) are refused."""

from __future__ import annotations

from runtime.model.config import ModelLoadError
from runtime.model.families.family import MOE_GGUF_NAMES, Family, GGUFField, GGUFTensor, Weights
from runtime.model.moe import check_experts, split_stacked_experts


def qwen_moe_fields(hf: dict) -> dict:
    """The experts of a Qwen MoE config.json (Qwen2-MoE's and Qwen3-MoE's read alike)."""
    if hf.get("use_sliding_window"):
        raise ModelLoadError("config.json: use_sliding_window true is not supported (no sliding-window attention yet)")
    layers = int(hf["num_hidden_layers"])
    step = int(hf.get("decoder_sparse_step") or 1)
    mlp_only = {int(i) for i in hf.get("mlp_only_layers") or []}
    return check_experts(
        {
            # transformers >= 5 writes `num_local_experts` for it
            "num_experts": int(hf.get("num_experts") or hf.get("num_local_experts") or 0),
            "experts_per_token": int(hf["num_experts_per_tok"]),
            "moe_intermediate_size": int(hf["moe_intermediate_size"]),
            "norm_topk_prob": bool(hf.get("norm_topk_prob", False)),
            "dense_layers": tuple(i for i in range(layers) if i in mlp_only or (i + 1) % step),
        }
    )


def qwen_moe_gguf_fields(field: GGUFField, norm_default: bool) -> dict:
    """convert_hf_to_gguf's Qwen2MoeModel fields as config.json fields (`norm_default`: what
    llama.cpp does for the arch where the file does not say)."""
    return {
        "num_experts": int(field("expert_count", 0)),
        "num_experts_per_tok": int(field("expert_used_count", 0)),
        "moe_intermediate_size": int(field("expert_feed_forward_length", 0)),
        "norm_topk_prob": bool(field("expert_weights_norm", norm_default)),
    }


def _config(hf: dict) -> dict:
    return {"qk_norm": True, "attention_bias": bool(hf.get("attention_bias", False)), **qwen_moe_fields(hf)}


def _gguf_config(field: GGUFField, _tensor: GGUFTensor) -> dict:
    return qwen_moe_gguf_fields(field, norm_default=True)


def _weights(weights: Weights, _cfg) -> Weights:
    return split_stacked_experts(weights)


QWEN3_MOE = Family(
    name="qwen3_moe",
    model_types=("qwen3_moe",),
    hf_architecture="Qwen3MoeForCausalLM",
    gguf_arch="qwen3moe",
    gguf_experts=True,
    gguf_names={
        "blk.{i}.attn_q_norm.weight": "model.layers.{i}.self_attn.q_norm.weight",
        "blk.{i}.attn_k_norm.weight": "model.layers.{i}.self_attn.k_norm.weight",
        **MOE_GGUF_NAMES,
    },
    config=_config,
    gguf_config=_gguf_config,
    weights=_weights,
)
