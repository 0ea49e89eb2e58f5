"""Qwen3: per-head RMSNorm on q and k before rope (`q_norm`, `k_norm`), no attention bias, and a
`head_dim` that need not be hidden_size / heads. GGUF arch `qwen3` (`blk.N.attn_q_norm`,
`attn_k_norm`; llama.cpp does not permute its Q/K rows)."""

from __future__ import annotations

from runtime.model.families.family import Family


def _config(hf: dict) -> dict:
    return {"qk_norm": True, "attention_bias": bool(hf.get("attention_bias", False))}


QWEN3 = Family(
    name="qwen3",
    model_types=("qwen3",),
    hf_architecture="Qwen3ForCausalLM",
    gguf_arch="qwen3",
    gguf_names={
        "blk.{i}.attn_q_norm.weight": "model.layers.{i}.self_attn.q_norm.weight",
        "blk.{i}.attn_k_norm.weight": "model.layers.{i}.self_attn.k_norm.weight",
    },
    config=_config,
)
