"""Llama (SmolLM2, Llama 2/3.x), Mistral and Qwen2: the shared decoder as it is.

Qwen2 differs only in q/k/v biases (on by default) and in llama.cpp not permuting its Q/K rows.
Llama 3.x rope scaling (`rope_type: llama3`) is runtime/model/rope.py's. Mistral's `sliding_window`
(4096 in Mistral 7B v0.1, null from v0.2 on) makes every layer a sliding-window layer, as
transformers' MistralAttention applies it; a GGUF does not carry it (llama.cpp reads none for llama).
"""

from __future__ import annotations

from runtime.model.families.family import Family


def sliding_window_fields(hf: dict) -> dict:
    """Every layer windowed where the config.json sets `sliding_window` (Mistral, Mixtral)."""
    window = hf.get("sliding_window")
    return {"layer_windows": (int(window),) * int(hf["num_hidden_layers"])} if window else {}


def _llama_config(hf: dict) -> dict:
    return sliding_window_fields(hf) if hf.get("model_type") == "mistral" else {}


LLAMA = Family(
    name="llama",
    model_types=("llama", "mistral"),
    hf_architecture="LlamaForCausalLM",
    gguf_arch="llama",
    gguf_permuted_qk=True,
    config=_llama_config,
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
