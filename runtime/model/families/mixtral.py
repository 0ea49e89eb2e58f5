"""Mixtral (`model_type: mixtral`): Mistral's attention with `num_local_experts` routed experts of
width `intermediate_size`, the top `num_experts_per_tok` per token, always renormalized
(runtime/model/moe.py). Its checkpoints name the experts `block_sparse_moe.experts.{e}.w1/w3/w2`
(gate, up, down) and the router `block_sparse_moe.gate`, renamed here to the decoder's names.
llama.cpp writes Mixtral as GGUF arch `llama` (Q/K rows permuted) with `llama.expert_count` set,
which is how the registry tells it from a dense Llama; its experts stacked (`ffn_gate_exps`) or, in
files written before April 2024, one tensor each (`ffn_gate.{e}`).
`sliding_window`, where set (no released Mixtral sets one), windows every layer, as for Mistral."""

from __future__ import annotations

import re

from runtime.model.families.family import MOE_GGUF_NAMES, Family, GGUFField, GGUFTensor, Weights
from runtime.model.families.llama import sliding_window_fields
from runtime.model.moe import check_experts, split_stacked_experts

_EXPERT = re.compile(r"^(.*)\.block_sparse_moe\.experts\.(\d+)\.(w1|w2|w3)\.weight$")
_PROJ = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}


def _config(hf: dict) -> dict:
    return check_experts(
        {
            "num_experts": int(hf["num_local_experts"]),
            "experts_per_token": int(hf["num_experts_per_tok"]),
            "moe_intermediate_size": int(hf["intermediate_size"]),
            "norm_topk_prob": True,
        }
    ) | sliding_window_fields(hf)


def _gguf_config(field: GGUFField, _tensor: GGUFTensor) -> dict:
    return {
        "num_local_experts": int(field("expert_count", 0)),
        "num_experts_per_tok": int(field("expert_used_count", 0)),
    }


def _weights(weights: Weights, _cfg) -> Weights:
    out = {}
    for name, w in weights.items():
        m = _EXPERT.match(name)
        if m is not None:
            base, e, kind = m.groups()
            out[f"{base}.mlp.experts.{e}.{_PROJ[kind]}.weight"] = w
        elif name.endswith(".block_sparse_moe.gate.weight"):
            out[name.replace(".block_sparse_moe.gate.", ".mlp.gate.")] = w
        else:
            out[name] = w
    return split_stacked_experts(out)  # transformers >= 5's fused form, or a GGUF's stacked experts


MIXTRAL = Family(
    name="mixtral",
    model_types=("mixtral",),
    hf_architecture="MixtralForCausalLM",
    gguf_arch="llama",
    gguf_experts=True,
    gguf_permuted_qk=True,
    gguf_names={
        **MOE_GGUF_NAMES,
        # llama.cpp's Mixtral files before its stacked experts (April 2024) name each expert's tensors
        "blk.{i}.ffn_gate.{e}.weight": "model.layers.{i}.mlp.experts.{e}.gate_proj.weight",
        "blk.{i}.ffn_up.{e}.weight": "model.layers.{i}.mlp.experts.{e}.up_proj.weight",
        "blk.{i}.ffn_down.{e}.weight": "model.layers.{i}.mlp.experts.{e}.down_proj.weight",
    },
    config=_config,
    gguf_config=_gguf_config,
    weights=_weights,
)
