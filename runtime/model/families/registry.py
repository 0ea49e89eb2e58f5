"""Every model family the runtime serves, found by config.json `model_type` or GGUF architecture."""

from __future__ import annotations

from typing import Any

from runtime.model.config import ModelConfig, ModelLoadError
from runtime.model.families.family import Family
from runtime.model.families.gemma3 import GEMMA3
from runtime.model.families.gpt_oss import GPT_OSS
from runtime.model.families.llama import LLAMA, QWEN2
from runtime.model.families.mixtral import MIXTRAL
from runtime.model.families.phi3 import PHI3
from runtime.model.families.qwen2_moe import QWEN2_MOE
from runtime.model.families.qwen3 import QWEN3
from runtime.model.families.qwen3_moe import QWEN3_MOE

FAMILIES: tuple[Family, ...] = (LLAMA, QWEN2, QWEN3, PHI3, QWEN2_MOE, QWEN3_MOE, MIXTRAL, GEMMA3, GPT_OSS)


def family_for_model_type(model_type: str) -> Family | None:
    return next((f for f in FAMILIES if model_type in f.model_types), None)


def family_for_gguf_arch(arch: str, experts: bool = False) -> Family | None:
    """The family of a GGUF architecture; `experts`: the file has routed experts (`{arch}.expert_count`
    > 0), which picks the arch's MoE family where it has one (llama with experts is Mixtral)."""
    of_arch = [f for f in FAMILIES if f.gguf_arch is not None and f.gguf_arch == arch]
    return next((f for f in of_arch if f.gguf_experts == experts), of_arch[0] if of_arch else None)


def supported_model_types() -> tuple[str, ...]:
    return tuple(t for f in FAMILIES for t in f.model_types)


def supported_gguf_archs() -> tuple[str, ...]:
    return tuple(dict.fromkeys(f.gguf_arch for f in FAMILIES if f.gguf_arch is not None))


def model_config(hf: dict[str, Any], source: str = "config.json") -> ModelConfig:
    """A config.json's `ModelConfig`, read by its family; an unsupported `model_type` is refused
    with the supported ones named."""
    model_type = hf.get("model_type", "")
    family = family_for_model_type(model_type)
    if family is None:
        raise ModelLoadError(
            f"{source}: unsupported architecture model_type={model_type!r} "
            f"(architectures={hf.get('architectures')}); supported: {', '.join(supported_model_types())}"
        )
    return ModelConfig.from_hf(hf, source, family.config)
