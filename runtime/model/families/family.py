"""What a model family is: the hooks a family module fills in for the shared decoder.

The decoder (runtime/model/decoder.py) reads Hugging Face Llama tensor names
(`model.layers.{i}.self_attn.q_proj.weight`, ...) plus optional per-head `q_norm` / `k_norm`,
and in a MoE layer `mlp.gate.weight` (the router) with `mlp.experts.{e}.{gate,up,down}_proj.weight`
(and `mlp.shared_expert.*` where there is one); a family whose checkpoints differ renames or splits
its tensors in `weights`. GGUF files are
turned into such a folder by runtime/model/loader.py through `gguf_names` and `gguf_config`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

# GGUF tensor names -> Hugging Face Llama names ("{i}" is the layer index), as llama.cpp's
# gguf-py writes them (gguf/constants.py TENSOR_NAMES) for llama-shaped architectures.
GGUF_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "blk.{i}.attn_norm.weight": "model.layers.{i}.input_layernorm.weight",
    "blk.{i}.ffn_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
    "blk.{i}.attn_q.weight": "model.layers.{i}.self_attn.q_proj.weight",
    "blk.{i}.attn_k.weight": "model.layers.{i}.self_attn.k_proj.weight",
    "blk.{i}.attn_v.weight": "model.layers.{i}.self_attn.v_proj.weight",
    "blk.{i}.attn_q.bias": "model.layers.{i}.self_attn.q_proj.bias",
    "blk.{i}.attn_k.bias": "model.layers.{i}.self_attn.k_proj.bias",
    "blk.{i}.attn_v.bias": "model.layers.{i}.self_attn.v_proj.bias",
    "blk.{i}.attn_output.weight": "model.layers.{i}.self_attn.o_proj.weight",
    "blk.{i}.ffn_gate.weight": "model.layers.{i}.mlp.gate_proj.weight",
    "blk.{i}.ffn_up.weight": "model.layers.{i}.mlp.up_proj.weight",
    "blk.{i}.ffn_down.weight": "model.layers.{i}.mlp.down_proj.weight",
}

# A MoE family's router and experts: llama.cpp stacks each layer's experts into one 3-D tensor
# (`ffn_*_exps`, [experts, rows, cols]), which the family's `weights` splits per expert
# (runtime/model/moe.py split_stacked_experts).
MOE_GGUF_NAMES = {
    "blk.{i}.ffn_gate_inp.weight": "model.layers.{i}.mlp.gate.weight",
    "blk.{i}.ffn_gate_exps.weight": "model.layers.{i}.mlp.experts.gate_proj.weight",
    "blk.{i}.ffn_up_exps.weight": "model.layers.{i}.mlp.experts.up_proj.weight",
    "blk.{i}.ffn_down_exps.weight": "model.layers.{i}.mlp.experts.down_proj.weight",
}

Weights = dict[str, torch.Tensor]
GGUFField = Callable[[str, Any], Any]  # (key without the "{arch}." prefix, default) -> value
GGUFTensor = Callable[[str], "list[float] | None"]  # a small tensor's values by GGUF name (None: absent)


def _no_fields(*_args) -> dict[str, Any]:
    return {}


def _same_weights(weights: Weights, _cfg) -> Weights:
    return weights


@dataclass(frozen=True)
class Family:
    name: str
    model_types: tuple[str, ...]  # config.json `model_type`s; the first is what a GGUF converts to
    hf_architecture: str  # config.json `architectures[0]` written for a converted GGUF
    gguf_arch: str | None = None  # GGUF `general.architecture`; None: not read from GGUF
    gguf_permuted_qk: bool = False  # llama.cpp permutes Q/K rows for rope (llama only, not qwen2/qwen3)
    # reads the GGUFs of `gguf_arch` with experts (`{arch}.expert_count` > 0: Mixtral is arch llama)
    gguf_experts: bool = False
    gguf_names: dict[str, str] = field(default_factory=dict)  # added to / overriding GGUF_NAMES
    # config.json dict -> ModelConfig fields that differ from the common reading
    config: Callable[[dict[str, Any]], dict[str, Any]] = _no_fields
    # (GGUF field reader, small-tensor reader) -> config.json fields beyond the common ones
    gguf_config: Callable[[GGUFField, GGUFTensor], dict[str, Any]] = _no_fields
    # checkpoint tensors -> the decoder's names (e.g. split a fused qkv); runs before the dtype cast
    weights: Callable[[Weights, Any], Weights] = _same_weights

    def gguf_tensor_names(self) -> dict[str, str]:
        return {**GGUF_NAMES, **self.gguf_names}
