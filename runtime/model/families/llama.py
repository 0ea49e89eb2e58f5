"""Llama (SmolLM2, Llama 2/3.x), Mistral and Qwen2: the shared decoder as it is.

Qwen2 differs only in q/k/v biases (on by default) and in llama.cpp not permuting its Q/K rows.
Llama 3.x rope scaling (`rope_type: llama3`) is runtime/model/rope.py's.
"""

from __future__ import annotations

from runtime.model.families.family import Family

LLAMA = Family(
    name="llama",
    model_types=("llama", "mistral"),
    hf_architecture="LlamaForCausalLM",
    gguf_arch="llama",
    gguf_permuted_qk=True,
)


def _qwen2_config(hf: dict) -> dict:
    return {"attention_bias": bool(hf.get("attention_bias", True))}


QWEN2 = Family(
    name="qwen2",
    model_types=("qwen2",),
    hf_architecture="Qwen2ForCausalLM",
    gguf_arch="qwen2",
    config=_qwen2_config,
)
