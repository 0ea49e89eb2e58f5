"""Llama-family decoder (Llama, Mistral, Qwen2, SmolLM2) in plain torch, over the KV pool.

Weights use Hugging Face names on disk; at load time Q/K/V and gate/up are fused into one matrix
each, which halves the number of matmul calls per layer (decode on CPU is call- and memory-bound).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from runtime.attention import AttentionBackend
from runtime.forward_batch import ForwardBatch
from runtime.kv_pool import KVPool
from runtime.model_config import ModelConfig, ModelLoadError
from runtime.rope import RotaryEmbedding


SMALL_GEMM_ROWS = 4


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    var = x.pow(2).mean(-1, keepdim=True)
    return x * torch.rsqrt(var + eps) * weight


class DecoderLayer:
    def __init__(self, w: dict[str, torch.Tensor], cfg: ModelConfig):
        self.input_norm = w["input_layernorm.weight"]
        self.post_norm = w["post_attention_layernorm.weight"]
        self.qkv = torch.cat([w["self_attn.q_proj.weight"], w["self_attn.k_proj.weight"], w["self_attn.v_proj.weight"]])
        self.qkv_bias = (
            torch.cat([w["self_attn.q_proj.bias"], w["self_attn.k_proj.bias"], w["self_attn.v_proj.bias"]])
            if cfg.attention_bias else None
        )
        self.o_proj = w["self_attn.o_proj.weight"]
        self.gate_up = torch.cat([w["mlp.gate_proj.weight"], w["mlp.up_proj.weight"]])
        self.down = w["mlp.down_proj.weight"]


class LlamaModel:
    def __init__(self, cfg: ModelConfig, weights: dict[str, torch.Tensor], device: torch.device, dtype: torch.dtype):
        self.cfg = cfg
        self.device = device
        self.dtype = dtype
        w = {k: v.to(device=device, dtype=dtype) for k, v in weights.items()}
        try:
            self.embed = w["model.embed_tokens.weight"]
            self.norm = w["model.norm.weight"]
            self.lm_head = self.embed if cfg.tie_word_embeddings or "lm_head.weight" not in w else w["lm_head.weight"]
            self.layers = []
            for i in range(cfg.num_layers):
                prefix = f"model.layers.{i}."
                self.layers.append(DecoderLayer({k[len(prefix):]: v for k, v in w.items() if k.startswith(prefix)}, cfg))
        except KeyError as e:
            raise ModelLoadError(f"weights: missing tensor {e}") from e
        self.rope = RotaryEmbedding(cfg, cfg.max_position_embeddings, device, dtype)
        self.q_size = cfg.num_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, kv: KVPool, attn: AttentionBackend) -> torch.Tensor:
        """Run the new tokens, write their K/V into `batch.out_slots`, return logits [N, vocab]
        for the rows in `batch.logits_index`."""
        cfg = self.cfg
        attn.prepare(batch)
        h = F.embedding(batch.input_ids, self.embed)
        t = h.shape[0]
        for li, layer in enumerate(self.layers):
            x = rms_norm(h, layer.input_norm, cfg.rms_norm_eps)
            qkv = F.linear(x, layer.qkv, layer.qkv_bias)
            q = qkv[:, : self.q_size].view(t, cfg.num_heads, cfg.head_dim)
            k = qkv[:, self.q_size : self.q_size + self.kv_size].view(t, cfg.num_kv_heads, cfg.head_dim)
            v = qkv[:, self.q_size + self.kv_size :].view(t, cfg.num_kv_heads, cfg.head_dim)
            q, k = self.rope.apply(q, k, batch.positions)
            kv.write(li, batch.out_slots, k, v)
            o = attn.forward(q, kv.k[li], kv.v[li]).reshape(t, self.q_size)
            h = h + F.linear(o, layer.o_proj)
            x = rms_norm(h, layer.post_norm, cfg.rms_norm_eps)
            gate, up = F.linear(x, layer.gate_up).chunk(2, dim=-1)
            h = h + F.linear(F.silu(gate) * up, layer.down)
        h = rms_norm(h[batch.logits_index], self.norm, cfg.rms_norm_eps)
        rows = h.shape[0]
        if h.device.type == "cpu" and 1 < rows < SMALL_GEMM_ROWS:
            # CPU BLAS takes a slow path for 2-3 rows (the 49k-row lm_head: 24/36 ms for 2/3 rows
            # against 19 ms for 4 on the dev machine); a draft being verified at batch 1 is that.
            h = torch.cat([h, h.new_zeros(SMALL_GEMM_ROWS - rows, h.shape[1])])
            return F.linear(h, self.lm_head)[:rows].float()
        return F.linear(h, self.lm_head).float()


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
