"""Qwen2-MoE / Qwen1.5-MoE (`model_type: qwen2_moe`; GGUF arch `qwen2moe`): Qwen2's attention (q/k/v
biases, `qkv_bias`) with routed experts as Qwen3-MoE's (not renormalized unless `norm_topk_prob`)
plus a shared expert on every token (`shared_expert_intermediate_size` wide), scaled by
sigmoid(`shared_expert_gate` . x) (runtime/model/moe.py). llama.cpp does not renormalize for this arch."""

from __future__ import annotations

from runtime.model.families.family import MOE_GGUF_NAMES, Family, GGUFField, GGUFTensor, Weights
from runtime.model.families.qwen3_moe import qwen_moe_fields, qwen_moe_gguf_fields
from runtime.model.moe import split_stacked_experts


def _config(hf: dict) -> dict:
    return {
        "attention_bias": bool(hf.get("qkv_bias", hf.get("attention_bias", True))),
        "shared_expert_intermediate_size": int(hf.get("shared_expert_intermediate_size") or 0),
        **qwen_moe_fields(hf),
    }


def _gguf_config(field: GGUFField, _tensor: GGUFTensor) -> dict:
    return {
        **qwen_moe_gguf_fields(field, norm_default=False),
        "shared_expert_intermediate_size": int(field("expert_shared_feed_forward_length", 0)),
    }


def _weights(weights: Weights, _cfg) -> Weights:
    return split_stacked_experts(weights)


QWEN2_MOE = Family(
    name="qwen2_moe",
    model_types=("qwen2_moe",),
    hf_architecture="Qwen2MoeForCausalLM",
    gguf_arch="qwen2moe",
    gguf_experts=True,
    gguf_names={
        **MOE_GGUF_NAMES,
        "blk.{i}.ffn_gate_inp_shexp.weight": "model.layers.{i}.mlp.shared_expert_gate.weight",
        "blk.{i}.ffn_gate_shexp.weight": "model.layers.{i}.mlp.shared_expert.gate_proj.weight",
        "blk.{i}.ffn_up_shexp.weight": "model.layers.{i}.mlp.shared_expert.up_proj.weight",
        "blk.{i}.ffn_down_shexp.weight": "model.layers.{i}.mlp.shared_expert.down_proj.weight",
    },
    config=_config,
    gguf_config=_gguf_config,
    weights=_weights,
)
