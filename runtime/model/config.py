"""The decoder shape the runtime needs, read from a Hugging Face `config.json` (through
runtime/model/families/registry.py's `model_config`, which picks the family and adds what it reads
differently)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


class ModelLoadError(RuntimeError):
    """A model folder or file that cannot be served; the message names the file and the problem."""


HIDDEN_ACTS = ("silu", "gelu_pytorch_tanh")  # the MLP gate activations the decoder runs


@dataclass
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # Qwen2 has q/k/v biases
    qk_norm: bool = False  # Qwen3: per-head RMSNorm on q and k before rope
    rotary_dim: int | None = None  # dims of a head that rope turns (Phi-4-mini: 3/4); None: all
    model_type: str = "llama"
    # Mixture of experts (Qwen3-MoE, Mixtral; runtime/model/moe.py): 0 experts is a dense model
    num_experts: int = 0
    experts_per_token: int = 0  # top-k routed experts per token
    moe_intermediate_size: int = 0  # one expert's MLP width
    norm_topk_prob: bool = True  # renormalize the top-k router probabilities to sum to 1
    dense_layers: tuple[int, ...] = ()  # layers with a dense MLP (intermediate_size) in a MoE model
    shared_expert_intermediate_size: int = 0  # an always-on expert beside the routed ones (0: none)
    # gpt-oss: the router picks the top-k logits and softmaxes those alone (else softmax, then top-k);
    # its experts' SwiGLU clamped at `swiglu_limit` (None: plain SiLU gate) with sigmoid gain `swiglu_alpha`
    moe_softmax_after_topk: bool = False
    swiglu_limit: float | None = None
    swiglu_alpha: float = 1.702
    # Sliding-window attention (Gemma 3): per layer, a window (> 0: a token sees the last `window`
    # positions up to its own) or 0 (every position); () is every layer global
    layer_windows: tuple[int, ...] = ()
    local_rope_theta: float | None = None  # windowed layers' own rope base, unscaled; None: the global rope
    attention_sinks: bool = False  # gpt-oss: a learned logit per head in each softmax (`self_attn.sinks`)
    hidden_act: str = "silu"  # the MLP's gate activation: silu, or gelu_pytorch_tanh (Gemma)
    embed_scale: float = 1.0  # the embeddings are multiplied by it (Gemma: sqrt(hidden_size))
    sandwich_norms: bool = False  # Gemma: an RMSNorm on the attention's and the MLP's output before each add
    norm_weight_offset: float = 0.0  # added to every norm weight at load (Gemma's norms scale by 1 + w)
    query_pre_attn_scalar: float | None = None  # scores scaled by its -1/2 power, not head_dim's (Gemma)
    final_logit_softcapping: float | None = None  # logits = cap * tanh(logits / cap) (Gemma)
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)

    def __post_init__(self):
        if self.rotary_dim is None:
            self.rotary_dim = self.head_dim
        if self.hidden_act not in HIDDEN_ACTS:
            raise ModelLoadError(
                f"config.json: hidden activation {self.hidden_act!r} is not supported (one of: {', '.join(HIDDEN_ACTS)})"
            )
        if self.layer_windows and len(self.layer_windows) != self.num_layers:
            raise ModelLoadError(f"config: {len(self.layer_windows)} layer windows for {self.num_layers} layers")

    def window(self, layer: int) -> int:
        """The layer's sliding window (0: global attention)."""
        return self.layer_windows[layer] if self.layer_windows else 0

    def is_moe_layer(self, layer: int) -> bool:
        return self.num_experts > 0 and layer not in self.dense_layers

    @classmethod
    def from_hf(
        cls,
        cfg: dict[str, Any],
        source: str = "config.json",
        family_fields: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    ) -> ModelConfig:
        """The fields every family reads alike, then `family_fields(cfg)` over them."""
        model_type = cfg.get("model_type", "")
        try:
            hidden = int(cfg["hidden_size"])
            heads = int(cfg["num_attention_heads"])
            # transformers >= 5 writes `rope_parameters` (theta + scaling) instead of `rope_scaling`.
            rope = cfg.get("rope_parameters") or {}
            eos = cfg.get("eos_token_id")
            eos_ids = [] if eos is None else ([int(eos)] if isinstance(eos, int) else [int(e) for e in eos])
            fields = dict(
                vocab_size=int(cfg["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(cfg["intermediate_size"]),
                num_layers=int(cfg["num_hidden_layers"]),
                num_heads=heads,
                num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
                head_dim=int(cfg.get("head_dim") or hidden // heads),
                rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-5)),
                rope_theta=float(cfg.get("rope_theta", rope.get("rope_theta", 10000.0))),
                rope_scaling=cfg.get("rope_scaling")
                or (rope if rope.get("rope_type", "default") != "default" else None),
                max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
                tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                attention_bias=bool(cfg.get("attention_bias", False)),
                model_type=model_type,
                bos_token_id=cfg.get("bos_token_id"),
                eos_token_ids=eos_ids,
            )
            if family_fields is not None:
                fields.update(family_fields(cfg))
            return cls(**fields)
        except (KeyError, TypeError, ValueError) as e:
            raise ModelLoadError(f"{source}: missing or invalid field {e}") from e
