"""The shared decoder of every model family (runtime/model/families/registry.py) in plain torch, over the KV pool.

Weights use Hugging Face Llama names (a family renames or splits its own first, `Family.weights`);
a family may add per-head q/k RMSNorm before rope (Qwen3), q/k/v biases (Qwen2) and rope variants
(runtime/model/rope.py); at load time Q/K/V and gate/up are fused into one matrix
each, which halves the number of matmul calls per layer (decode on CPU is call- and memory-bound).
Linear layers run in one weight format (runtime/model/linear.py, chosen by runtime/model/weight_format.py);
norms, embedding, rope and the residual stream stay in the engine dtype.

Where the linear layers are q4, q8 or bf16 on CPU under a float32 engine, the small ops between
the matmuls run fused (runtime/cpu_kernels/layer_ops.cpp), in the layers' activation dtype (bf16;
float32 for q4 through the AVX2 kernels): the norm writes the matmul's input, one op rotates q and k and writes K/V into the pool, silu(gate) * up is one
op, and each residual add takes the bf16 output as it is and runs with the norm after it. That is
9 dispatcher ops a layer instead of ~40, whose dispatch was a third of a batch-1 step. (q4's linear
layers run runtime/cpu_kernels/quant_linear.cpp, through runtime/model/linear.py.) Where every linear
layer is one that runtime/cpu_kernels/decoder_layers.cpp can call, all layers of a pass run in that
one call (the same kernels in the same order, so the same bits): ~13 calls from Python a layer,
2.5-3 us each, were ~1 ms of a batch-1 step. Each fused op
computes a row alone, in a fixed order, so batch invariance holds through them. fp32 keeps the plain torch ops: it is
the bit-for-bit reference. A model with q/k norms (Qwen3) runs the fused ops layer by layer, the
norms between the qkv matmul and rope in torch: the one-call layer loop has no step for them.
A MoE layer (Qwen3-MoE, Mixtral) runs routed experts (runtime/model/moe.py) in place of gate_up and
down; the loop has no routing step either, so a MoE model runs the fused ops layer by layer too.

Gemma 3 (runtime/model/families/gemma3.py) adds: sliding-window layers (`cfg.layer_windows`, passed
to the attention backend per layer) with their own rope base (`local_rope_theta`), a norm on the
attention's and the MLP's outputs (`sandwich_norms`), a GeLU-tanh MLP, the embeddings scaled and
the logits soft-capped. The fused ops have no step for the extra norms or GeLU, so such a model runs
the plain torch ops in every weight format (the linear layers still in theirs); a model with
windows but neither (Mistral's `sliding_window`) keeps the fused ops layer by layer, not the
one-call loop, which has no window.

gpt-oss (runtime/model/families/gpt_oss.py) adds attention sinks (`self_attn.sinks`, passed to the
attention backend per layer), an o_proj bias, and experts with biases and a clamped SwiGLU
(runtime/model/moe.py); as a MoE model it runs layer by layer.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

from runtime.attention import AttentionBackend
from runtime.cpu_kernels import load_cpu_kernels
from runtime.forward_batch import ForwardBatch
from runtime.kvcache.pool import KVPool
from runtime.model.config import ModelConfig, ModelLoadError
from runtime.model.families.registry import family_for_model_type
from runtime.model.linear import DenseLinear, make_int8_group_linear, make_q4_linear, make_q8_linear
from runtime.model.moe import MoEMLP, clamped_swiglu
from runtime.model.quant_codes import Int4Codes, Int8Codes
from runtime.model.rope import RotaryEmbedding
from runtime.model.weight_format import DTYPE_FORMATS, FORMAT_DTYPES, choose_format

SMALL_GEMM_ROWS = 4
# config hidden_act -> the MLP's gate activation (gelu_pytorch_tanh: Gemma's GeLU, tanh approximation)
ACTIVATIONS = {"silu": F.silu, "gelu_pytorch_tanh": partial(F.gelu, approximate="tanh")}
FUSED_FORMATS = frozenset({"q4", "q8", "bf16"})  # linear layers with bf16 activations


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    var = x.pow(2).mean(-1, keepdim=True)
    return x * torch.rsqrt(var + eps) * weight


def make_linear(
    fmt: str,
    parts: list[torch.Tensor],
    bias: torch.Tensor | None,
    dtype: torch.dtype,
    int4: list[Int4Codes | None] | None = None,
):
    """One linear layer in `fmt` from row-stacked `parts` (float weights). For q4, `int4` gives each
    part's own 4-bit codes where the source has them; other parts are quantized here."""
    if fmt == "q4":
        int4 = int4 or [None] * len(parts)
        return make_q4_linear(
            Int4Codes.cat([q if q is not None else Int4Codes.quantize(w) for q, w in zip(int4, parts)]), bias
        )
    w = parts[0] if len(parts) == 1 else torch.cat(parts)
    if fmt == "q8":
        return make_q8_linear(w, bias)
    return DenseLinear(w, bias, FORMAT_DTYPES.get(fmt, dtype))


class DecoderLayer:
    def __init__(
        self,
        w: dict[str, torch.Tensor],
        cfg: ModelConfig,
        fmt: str,
        dtype: torch.dtype,
        int4: dict[str, Int4Codes],
        index: int = 0,
    ):
        def linear(names: list[str], bias: bool = False):
            b = torch.cat([w[n.replace(".weight", ".bias")] for n in names]) if bias else None
            return make_linear(fmt, [w[n] for n in names], b, dtype, [int4.get(n) for n in names])

        self.input_norm = w["input_layernorm.weight"]
        self.post_norm = w["post_attention_layernorm.weight"]
        self.qkv = linear(
            ["self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"], cfg.attention_bias
        )
        self.o_proj = linear(["self_attn.o_proj.weight"], "self_attn.o_proj.bias" in w)  # gpt-oss has one
        self.moe = _moe_mlp(w, cfg, linear) if cfg.is_moe_layer(index) else None  # routed experts instead
        self.gate_up = None if self.moe else linear(["mlp.gate_proj.weight", "mlp.up_proj.weight"])
        self.down = None if self.moe else linear(["mlp.down_proj.weight"])
        self.q_norm = w["self_attn.q_norm.weight"] if cfg.qk_norm else None  # over each head's dims
        self.k_norm = w["self_attn.k_norm.weight"] if cfg.qk_norm else None
        self.window = cfg.window(index)  # > 0: a sliding-window layer
        self.sinks = w["self_attn.sinks"].float() if cfg.attention_sinks else None  # gpt-oss, per query head
        if self.sinks is not None and tuple(self.sinks.shape) != (cfg.num_heads,):
            raise ModelLoadError(
                f"weights: layer {index} has sinks of shape {tuple(self.sinks.shape)}, not ({cfg.num_heads},)"
            )
        # Gemma's norms of the attention's and the MLP's output, before each residual add
        self.attn_out_norm = w["attn_output_norm.weight"] if cfg.sandwich_norms else None
        self.mlp_out_norm = w["mlp_output_norm.weight"] if cfg.sandwich_norms else None


def _moe_mlp(w: dict[str, torch.Tensor], cfg: ModelConfig, linear) -> MoEMLP:
    """A MoE layer's experts (`mlp.experts.{e}.*`, `mlp.gate` the router), each in the model's format."""

    def pair(prefix: str) -> tuple:
        bias = f"{prefix}.down_proj.bias" in w  # gpt-oss's experts have biases
        return linear([f"{prefix}.gate_proj.weight", f"{prefix}.up_proj.weight"], bias), linear(
            [f"{prefix}.down_proj.weight"], bias
        )

    experts = [pair(f"mlp.experts.{e}") for e in range(cfg.num_experts)]
    shared = pair("mlp.shared_expert") if cfg.shared_expert_intermediate_size else None
    glu = None if cfg.swiglu_limit is None else partial(clamped_swiglu, alpha=cfg.swiglu_alpha, limit=cfg.swiglu_limit)
    return MoEMLP(
        w["mlp.gate.weight"],
        experts,
        cfg.experts_per_token,
        cfg.norm_topk_prob,
        shared,
        w.get("mlp.shared_expert_gate.weight") if shared else None,
        w.get("mlp.gate.bias"),  # gpt-oss's router bias
        cfg.moe_softmax_after_topk,
        glu,
    )


# The logits layer's format per linear format. int4 would cost the logits too much accuracy. Under
# q4 the logits layer runs the GGUF's own Q8_0 codes of the (tied) embedding through the int8 kernel
# (exact weights, half the bytes of bf16) where it is built; elsewhere, and for a source without Q8_0
# codes, it is bf16: with the per-channel int8 logits layer (re-quantized) q4's decode path agreed
# with fp32 on 96.9% of greedy tokens, with bf16 on 98.0% (tests/runtime/model/test_weight_formats.py).
LM_HEAD_FORMATS = {"q4": "bf16", "q8": "q8"}


class DecoderModel:
    """`fmt` None: every linear layer dense in `dtype` (the reference). `codes`: the GGUF's own codes
    by Hugging Face name (`read_gguf_codes`: Int4Codes of Q4_1 tensors, Int8Codes of Q8_0 ones),
    used by fmt q4. `weights` / `weights_reason` report the format and why."""

    def __init__(
        self,
        cfg: ModelConfig,
        weights: dict[str, torch.Tensor],
        device: torch.device,
        dtype: torch.dtype,
        fmt: str | None = None,
        reason: str = "the engine dtype",
        codes: dict[str, Int4Codes | Int8Codes] | None = None,
        shard=None,
    ):
        self.device = device
        self.dtype = dtype
        self.weights = fmt or DTYPE_FORMATS.get(dtype, str(dtype))
        self.weights_reason = reason
        family = family_for_model_type(cfg.model_type)
        if family is None:  # models.registry.model_config refuses these; a hand-made config may not
            raise ModelLoadError(f"model_type {cfg.model_type!r}: no model family")
        w = family.weights(weights, cfg)
        if shard is not None:  # a tensor-parallel rank: its slices, heads and MLP columns (runtime/parallel/)
            w, cfg = shard(w, cfg)
        self.cfg = cfg
        w = {k: v.to(device=device, dtype=dtype) for k, v in w.items()}
        codes = codes or {}
        try:
            self.embed = w["model.embed_tokens.weight"]
            self.norm = w["model.norm.weight"]
            tied = cfg.tie_word_embeddings or "lm_head.weight" not in w
            lm_head = self.embed if tied else w["lm_head.weight"]
            lm_codes = codes.get("model.embed_tokens.weight" if tied else "lm_head.weight")
            if self.weights == "q4" and isinstance(lm_codes, Int8Codes):
                self.lm_head = make_int8_group_linear(lm_codes)
            else:
                self.lm_head = make_linear(LM_HEAD_FORMATS.get(self.weights, self.weights), [lm_head], None, dtype)
            self.layers = []
            for i in range(cfg.num_layers):
                prefix = f"model.layers.{i}."
                own = {k[len(prefix) :]: v for k, v in w.items() if k.startswith(prefix)}
                own_int4 = {
                    k[len(prefix) :]: v for k, v in codes.items() if k.startswith(prefix) and isinstance(v, Int4Codes)
                }
                self.layers.append(DecoderLayer(own, cfg, self.weights, dtype, own_int4, i))
        except KeyError as e:
            raise ModelLoadError(f"weights: missing tensor {e}") from e
        self.rope = RotaryEmbedding(cfg, cfg.max_position_embeddings, device, dtype)
        self.local_rope = None  # the windowed layers' own rope (Gemma 3: another base, no scaling)
        if cfg.local_rope_theta is not None:
            local = replace(cfg, rope_theta=cfg.local_rope_theta, rope_scaling=None)
            self.local_rope = RotaryEmbedding(local, cfg.max_position_embeddings, device, dtype)
        self.act = ACTIVATIONS[cfg.hidden_act]  # one of config.HIDDEN_ACTS (ModelConfig checks it)
        self.q_size = cfg.num_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim
        fusable = device.type == "cpu" and dtype == torch.float32 and self.weights in FUSED_FORMATS
        fusable = fusable and cfg.hidden_act == "silu" and not cfg.sandwich_norms  # no fused op for these
        self.fused_ops = load_cpu_kernels() if fusable else None  # None: plain torch (or no compiler)
        if self.fused_ops is not None:  # the linear layers' activations: bf16, or float32 (q4's AVX2 kernels)
            self._act = self.layers[0].qkv.act_dtype
            bf16 = self._act == torch.bfloat16
            ops = self.fused_ops
            self._norm = ops.rms_norm_bf16 if bf16 else ops.rms_norm_f32
            self._add_norm = ops.add_rms_norm_bf16 if bf16 else ops.add_rms_norm_f32
            self._silu_mul = ops.silu_mul_bf16 if bf16 else ops.silu_mul_f32
        # made once: each pass would otherwise convert every layer's tensors from a Python list
        loop = self.layer_loop_spec()
        self._loop = None if loop is None else torch.classes.jumpgate_cpu.DecoderWeights(*loop)

    @property
    def graph_capturable(self) -> bool:
        """Whether a decode pass can be captured as a CUDA graph: MoE routing picks its experts on
        the host (data-dependent control flow), so a MoE model runs eagerly."""
        return all(layer.moe is None for layer in self.layers)

    @property
    def layer_loop(self) -> object | None:
        """The fused layers' weights for the one-call C++ layer loop (None: the Python loop runs)."""
        return self._loop

    @contextmanager
    def python_layer_loop(self) -> Iterator[None]:
        """Run the per-layer Python loop while inside (tests and benches compare it with the one call)."""
        kept, self._loop = self._loop, None
        try:
            yield
        finally:
            self._loop = kept

    def layer_loop_spec(self) -> tuple[list[int], list[torch.Tensor | None]] | None:
        """(kinds, params) of every layer for runtime/cpu_kernels/decoder_layers.cpp, which runs the
        fused layers in one call; None where some linear layer only runs from Python (or takes
        another activation dtype)."""
        if self.fused_ops is None or self.cfg.qk_norm:  # the C++ loop has no q/k norm step
            return None
        if any(layer.window for layer in self.layers) or self.local_rope is not None:  # nor a window
            return None
        if any(layer.sinks is not None for layer in self.layers):  # nor attention sinks
            return None
        if any(layer.moe is not None for layer in self.layers):  # nor a routing step (MoEMLP.loop_spec)
            return None
        kinds, params = [], []
        after = [layer.input_norm for layer in self.layers[1:]] + [self.norm]
        for layer, next_norm in zip(self.layers, after):
            for lin in (layer.qkv, layer.o_proj, layer.gate_up, layer.down):
                spec = lin.loop_spec()
                if spec is None or lin.act_dtype != self._act:
                    return None
                kinds.append(spec[0])
                params.extend(spec[1:])
            params.extend([layer.post_norm, next_norm])
        return kinds, params

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, kv: KVPool, attn: AttentionBackend, window=None) -> torch.Tensor:
        """Run the new tokens, write their K/V into `batch.out_slots`, return logits [N, vocab]
        for the rows in `batch.logits_index`. `window`: (the pass over window slots, its backend)
        where the window layers keep their own slots (runtime/kvcache/window_pool.py)."""
        cfg = self.cfg
        attn.prepare(batch)
        plans = [(batch, attn)] * len(self.layers)
        if window is not None:
            window[1].prepare(window[0])
            plans = [window if layer.window else (batch, attn) for layer in self.layers]
        h = self.embed_tokens(batch.input_ids)
        if cfg.embed_scale != 1.0:  # in the embeddings' dtype, as transformers' Gemma3TextScaledWordEmbedding
            h = h * torch.tensor(cfg.embed_scale, dtype=h.dtype)
        cos, sin = self.rope.tables(batch.positions)  # once per pass, not per layer
        if self.local_rope is not None:
            local = self.local_rope.tables(batch.positions)
            tables = [local if layer.window else (cos, sin) for layer in self.layers]
        else:
            tables = [(cos, sin)] * len(self.layers)
        if self.fused_ops is not None:
            return self._softcap(self._fused_forward(h, tables, batch, kv, attn, plans))
        for li, layer in enumerate(self.layers):
            self._torch_layer(li, layer, h, *tables[li], *plans[li], kv)
        h = self._pad_small(batch.logits_rows(h))
        logits = self.lm_head(rms_norm(h, self.norm, cfg.rms_norm_eps))
        return self._softcap(logits[: batch.logits_index.shape[0]].float())

    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        """The input embeddings (a tensor-parallel rank's own: runtime/parallel/model.py)."""
        return F.embedding(ids, self.embed)

    def _softcap(self, logits: torch.Tensor) -> torch.Tensor:
        cap = self.cfg.final_logit_softcapping
        return logits if not cap else torch.tanh(logits / cap) * cap

    @staticmethod
    def _attend(attn: AttentionBackend, layer, q, k_cache, v_cache, dtype=None) -> torch.Tensor:
        """The layer's attention (its window and sinks passed only where it has them); in `dtype` where given."""
        extra = (layer.window,) if layer.window else ()
        if layer.sinks is not None:
            extra = (layer.window, layer.sinks)
        if dtype is None:
            return attn.forward(q, k_cache, v_cache, *extra)
        return attn.forward_as(q, k_cache, v_cache, dtype, *extra)

    @staticmethod
    def _pad_small(x: torch.Tensor) -> torch.Tensor:
        rows = x.shape[0]
        if x.device.type == "cpu" and 1 < rows < SMALL_GEMM_ROWS:
            # CPU BLAS takes a slow path for 2-3 rows (the 49k-row lm_head: 24/36 ms for 2/3 rows
            # against 19 ms for 4 on the dev machine); a draft being verified at batch 1 is that.
            x = torch.cat([x, x.new_zeros(SMALL_GEMM_ROWS - rows, x.shape[1])])
        return x

    def _fused_forward(self, h, rope, batch, kv, attn, plans) -> torch.Tensor:
        """Each residual add runs with the norm after it (the next layer's input norm, the last
        one's the final norm) as one op; a zero pad row normalizes to zeros, as before. `rope`: each
        layer's (cos, sin) tables."""
        eps = self.cfg.rms_norm_eps
        x = self._norm(h, self.layers[0].input_norm, eps)
        tables = attn.paged_tables() if self._loop is not None else None
        if tables is not None:  # every layer in one call: the same kernels, the same bits
            slots, meta, tiles, bf16_products = tables
            x = self.fused_ops.decoder_layers(
                h,
                x,
                *rope[0],
                batch.out_slots,
                kv.k,
                kv.v,
                self._loop,
                slots,
                meta,
                tiles,
                self.cfg.num_heads,
                eps,
                bf16_products,
            )
        else:
            after = [layer.input_norm for layer in self.layers[1:]] + [self.norm]
            for li, (layer, next_norm) in enumerate(zip(self.layers, after)):
                x = self._fused_layer(li, layer, h, x, next_norm, *rope[li], *plans[li], kv)
        logits = self.lm_head.native(self._pad_small(batch.logits_rows(x)).to(self.lm_head.act_dtype))
        return logits[: batch.logits_index.shape[0]].float()

    def _torch_layer(self, li, layer, h, cos, sin, batch, attn, kv) -> None:
        cfg, t = self.cfg, h.shape[0]
        x = rms_norm(h, layer.input_norm, cfg.rms_norm_eps)
        qkv = layer.qkv(x)
        q = qkv[:, : self.q_size].view(t, cfg.num_heads, cfg.head_dim)
        k = qkv[:, self.q_size : self.q_size + self.kv_size].view(t, cfg.num_kv_heads, cfg.head_dim)
        v = qkv[:, self.q_size + self.kv_size :].view(t, cfg.num_kv_heads, cfg.head_dim)
        if layer.q_norm is not None:
            q, k = rms_norm(q, layer.q_norm, cfg.rms_norm_eps), rms_norm(k, layer.k_norm, cfg.rms_norm_eps)
        q, k = self.rope.rotate(q, cos, sin), self.rope.rotate(k, cos, sin)
        kv.write(li, batch.out_slots, k, v)
        o = self._attend(attn, layer, q, kv.k[li], kv.v[li]).reshape(t, self.q_size)
        delta = layer.o_proj(o)
        if layer.attn_out_norm is not None:
            delta = rms_norm(delta, layer.attn_out_norm, cfg.rms_norm_eps)
        h += delta  # in place: no new residual tensor per layer
        x = rms_norm(h, layer.post_norm, cfg.rms_norm_eps)
        if layer.moe is not None:
            h += layer.moe(x)  # float32 sums of the experts' rows
            return
        gate, up = layer.gate_up(x).chunk(2, dim=-1)
        delta = layer.down(self.act(gate) * up)
        if layer.mlp_out_norm is not None:
            delta = rms_norm(delta, layer.mlp_out_norm, cfg.rms_norm_eps)
        h += delta

    def _fused_layer(self, li, layer, h, x, next_norm, cos, sin, batch, attn, kv) -> torch.Tensor:
        """x: this layer's normed input (in the activation dtype); h grows in place; returns
        next_norm(h) in it."""
        ops, cfg, t = self.fused_ops, self.cfg, h.shape[0]
        qkv = layer.qkv.native(x)
        if layer.q_norm is not None:
            qkv = self._qk_norm(layer, qkv)
        q = ops.rope_store(qkv, cos, sin, batch.out_slots, kv.k[li], kv.v[li], cfg.num_heads)
        o = self._attend(attn, layer, q, kv.k[li], kv.v[li], self._act).reshape(t, self.q_size)  # o_proj's input
        # a bf16 delta into the float32 stream is an exact widening
        x = self._add_norm(h, layer.o_proj.native(o), layer.post_norm, cfg.rms_norm_eps)
        if layer.moe is not None:
            h += layer.moe(x)
            return self._norm(h, next_norm, cfg.rms_norm_eps)
        return self._add_norm(
            h, layer.down.native(self._silu_mul(layer.gate_up.native(x))), next_norm, cfg.rms_norm_eps
        )

    def _qk_norm(self, layer, qkv: torch.Tensor) -> torch.Tensor:
        """qkv (activation dtype) with each q and k head RMS-normed, in float32 as the torch path."""
        cfg, t = self.cfg, qkv.shape[0]
        q = qkv[:, : self.q_size].float().view(t, cfg.num_heads, cfg.head_dim)
        k = qkv[:, self.q_size : self.q_size + self.kv_size].float().view(t, cfg.num_kv_heads, cfg.head_dim)
        q, k = rms_norm(q, layer.q_norm, cfg.rms_norm_eps), rms_norm(k, layer.k_norm, cfg.rms_norm_eps)
        return torch.cat(
            [q.reshape(t, -1).to(qkv.dtype), k.reshape(t, -1).to(qkv.dtype), qkv[:, self.q_size + self.kv_size :]],
            dim=1,
        )


def load_weights(model_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{model_dir}: no *.safetensors weight files")
    weights: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            weights.update(load_file(str(f)))
        except (SafetensorError, OSError, ValueError) as e:
            raise ModelLoadError(f"{f}: corrupt or unreadable safetensors file ({e})") from e
    return weights


def load_model(
    model_dir: Path,
    cfg: ModelConfig,
    weights: str,
    device: torch.device,
    dtype: torch.dtype,
    invariant_attention: bool = False,
) -> DecoderModel:
    """The model in the requested weight format (`auto` chooses, knowing whether the attention
    backend is batch-invariant; `model.weights_reason` says why)."""
    fmt, reason, codes = _resolve(model_dir, weights, device, dtype, invariant_attention)
    return DecoderModel(cfg, load_weights(model_dir), device, dtype, fmt, reason, codes if fmt == "q4" else None)


def resolve_format(
    model_dir: Path, weights: str, device: torch.device, dtype: torch.dtype, invariant_attention: bool = False
) -> tuple[str, str]:
    """(format, reason) that `load_model` would use, without building the model."""
    return _resolve(model_dir, weights, device, dtype, invariant_attention)[:2]


def _resolve(model_dir, weights, device, dtype, invariant_attention):
    from runtime.model.loader import read_gguf_codes, source_gguf

    gguf = source_gguf(model_dir)
    codes = read_gguf_codes(gguf) if gguf is not None and weights in ("auto", "q4") else {}
    gguf_q4 = any(isinstance(c, Int4Codes) for c in codes.values())
    fmt, reason = choose_format(weights, device, dtype, gguf_q4=gguf_q4, invariant_attention=invariant_attention)
    return fmt, reason, codes
