"""A GGUF file of each family loads as its Hugging Face folder does: a tiny random model built with
transformers' class is written as GGUF by the `gguf` package, with the tensor names llama.cpp's
converter gives it (gguf-py's own name map, not Jumpgate's) and Q/K rows permuted where llama.cpp
permutes them (llama only), with a 512-token slice of the SmolLM2 tokenizer; Jumpgate converts it
back, and its logits (a prefill, then decode steps) equal the folder's."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch

from runtime.model.config import ModelLoadError
from runtime.model.decoder import DecoderModel, load_weights
from runtime.model.loader import read_config, resolve_model_dir
from tests.runtime.model.test_model_families import PROMPT, longrope, run_ours
from tests.runtime.model.test_model_families import save_tiny as save_tiny_model
from tests.runtime.model.test_moe_families import mixtral, qwen2_moe, qwen3_moe

CPU = torch.device("cpu")
VOCAB = 512  # the tiny models' vocabulary: SmolLM2's first 512 tokens
FIRST_PLAIN_TOKEN = 17  # SmolLM2's ids below this are special (control) tokens
IDS = list(range(20, 44))  # a prompt of 24 tokens in that vocabulary
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}


def _llama_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf LlamaModel.permute (half-split -> interleaved rope rows)."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _llama3_rope_freqs(cfg) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf LlamaModel.generate_extra_tensors for `rope_type: llama3`."""
    import math

    scaling = cfg.rope_scaling
    freqs = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float32) / cfg.head_dim))
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old = scaling["original_max_position_embeddings"]
    out = []
    for freq in freqs.tolist():
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            out.append(1)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, dtype=np.float32)


def _small_vocab(tokenizer_dir: Path, size: int) -> tuple[list[str], list[int], list[str]]:
    """The first `size` tokens of the SmolLM2 BPE vocabulary with the merges among them: a real
    tokenizer small enough that gguf's reader parses it at once (the full one takes seconds)."""
    model = json.loads((tokenizer_dir / "tokenizer.json").read_text())["model"]
    tokens = [t for t, i in sorted(model["vocab"].items(), key=lambda kv: kv[1]) if i < size]
    have = set(tokens)
    merges = [f"{a} {b}" for a, b in model["merges"] if a in have and b in have and a + b in have]
    return tokens, [3 if i < FIRST_PLAIN_TOKEN else 1 for i in range(len(tokens))], merges


def _stack_experts(weights: dict) -> dict:
    """Each layer's experts stacked into one [experts, rows, cols] tensor per projection, named as
    convert_hf_to_gguf names them before the map (`mlp.experts.gate_proj.weight`, Mixtral's
    `block_sparse_moe.experts.w1.weight`)."""
    import re

    out, stacks = {}, {}
    for name, w in weights.items():
        m = re.match(r"^(.*\.experts)\.(\d+)\.(\w+)\.weight$", name)
        if m is None:
            out[name] = w
        else:
            stacks.setdefault(f"{m[1]}.{m[3]}.weight", {})[int(m[2])] = w
    for name, parts in stacks.items():
        out[name] = torch.stack([parts[e] for e in range(len(parts))])
    return out


def _per_expert_name(name: str) -> str | None:
    """An expert tensor's name in llama.cpp's Mixtral files before stacked experts (its convert.py):
    `blk.N.ffn_gate.E.weight` for `model.layers.N.block_sparse_moe.experts.E.w1.weight`."""
    import re

    m = re.match(r"^model\.layers\.(\d+)\.block_sparse_moe\.experts\.(\d+)\.(w1|w2|w3)\.weight$", name)
    if m is None:
        return None
    proj = {"w1": "gate", "w3": "up", "w2": "down"}[m[3]]
    return f"blk.{m[1]}.ffn_{proj}.{m[2]}.weight"


def write_gguf(
    hf_dir: Path, out: Path, arch_name: str, tokenizer_dir: Path, experts_type=None, stack: bool = True
) -> Path:
    """`hf_dir` as a float32 GGUF of architecture `arch_name`, as convert_hf_to_gguf writes one;
    `experts_type` (a GGMLQuantizationType): the stacked experts in those blocks; `stack` False:
    Mixtral's experts one tensor each, as llama.cpp wrote them before April 2024."""
    import gguf
    from gguf.quants import quantize
    from safetensors.torch import load_file

    cfg = read_config(hf_dir)
    arch = next(a for a, name in gguf.MODEL_ARCH_NAMES.items() if name == arch_name)
    names = gguf.get_tensor_name_map(arch, cfg.num_layers)
    writer = gguf.GGUFWriter(str(out), arch_name)
    writer.add_block_count(cfg.num_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_heads)
    writer.add_head_count_kv(cfg.num_kv_heads)
    writer.add_key_length(cfg.head_dim)
    writer.add_value_length(cfg.head_dim)
    writer.add_rope_freq_base(cfg.rope_theta)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_vocab_size(cfg.vocab_size)
    tokens, types, merges = _small_vocab(tokenizer_dir, cfg.vocab_size)  # as convert_hf_to_gguf's _set_vocab_gpt2
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    if cfg.num_experts:  # convert_hf_to_gguf TextModel / Qwen2MoeModel.set_gguf_parameters
        writer.add_expert_count(cfg.num_experts)
        writer.add_expert_used_count(cfg.experts_per_token)
        if arch_name != "llama":  # Mixtral's experts are feed_forward_length wide
            writer.add_expert_feed_forward_length(cfg.moe_intermediate_size)
        if cfg.shared_expert_intermediate_size:
            writer.add_expert_shared_feed_forward_length(cfg.shared_expert_intermediate_size)
    if cfg.rope_scaling and cfg.rope_scaling.get("rope_type") == "llama3":
        writer.add_tensor("rope_freqs.weight", _llama3_rope_freqs(cfg))
    if arch_name == "phi3":  # convert_hf_to_gguf Phi3MiniModel.set_gguf_parameters / generate_extra_tensors
        import math

        rope = cfg.rope_scaling
        writer.add_rope_dimension_count(cfg.rotary_dim)
        orig = rope["original_max_position_embeddings"]
        writer.add_rope_scaling_orig_ctx_len(orig)
        scale = cfg.max_position_embeddings / orig
        writer.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(orig)) if scale > 1.0 else 1.0)
        writer.add_tensor("rope_factors_long.weight", np.asarray(rope["long_factor"], dtype=np.float32))
        writer.add_tensor("rope_factors_short.weight", np.asarray(rope["short_factor"], dtype=np.float32))
    if arch_name == "gemma3":  # convert_hf_to_gguf Gemma3Model.set_gguf_parameters
        writer.add_sliding_window(max(cfg.layer_windows))
        if cfg.rope_scaling:
            writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            writer.add_rope_scaling_factor(cfg.rope_scaling["factor"])
    if arch_name == "gpt-oss":  # convert_hf_to_gguf GptOssModel.set_gguf_parameters
        writer.add_sliding_window(max(cfg.layer_windows))
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(cfg.rope_scaling["factor"])
        writer.add_rope_scaling_orig_ctx_len(cfg.rope_scaling["original_max_position_embeddings"])
    weights = load_file(str(hf_dir / "model.safetensors"))
    for name, w in (_stack_experts(weights) if stack else weights).items():
        target = _per_expert_name(name) or names.get_name(name, try_suffixes=(".weight", ".bias"))
        assert target is not None, name
        w = w.float().numpy()
        if arch_name == "gemma3" and name.endswith("norm.weight"):  # Gemma3Model.modify_tensors: 1 + w
            w = w + 1
        if arch_name == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            w = _llama_permute(w, cfg.num_heads if "q_proj" in name else cfg.num_kv_heads)
        if experts_type is not None and w.ndim == 3:
            writer.add_tensor(target, quantize(np.ascontiguousarray(w), experts_type), raw_dtype=experts_type)
            continue
        writer.add_tensor(target, np.ascontiguousarray(w))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


@pytest.fixture
def cache_dir(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("JUMPGATE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _build(kind: str, out: Path, tokenizer_dir: Path) -> Path:
    import transformers as tf

    save_tiny = partial(save_tiny_model, vocab_size=VOCAB)

    if kind == "llama":
        return save_tiny(out, tokenizer_dir, tf.LlamaConfig, tf.LlamaForCausalLM)
    if kind == "llama3":  # Llama 3.x rope scaling, which llama.cpp writes as rope_freqs.weight
        return save_tiny(out, tokenizer_dir, tf.LlamaConfig, tf.LlamaForCausalLM, rope_scaling=LLAMA3_ROPE)
    if kind == "qwen2":
        return save_tiny(out, tokenizer_dir, tf.Qwen2Config, tf.Qwen2ForCausalLM)
    if kind == "phi3":  # Phi-4-mini's shape: partial rotary with longrope
        return save_tiny(
            out,
            tokenizer_dir,
            tf.Phi3Config,
            tf.Phi3ForCausalLM,
            pad_token_id=0,
            partial_rotary_factor=0.75,
            max_position_embeddings=256,
            original_max_position_embeddings=16,
            rope_scaling=longrope(6, 2),
        )
    if kind == "gemma3":  # as llama.cpp reads gemma3: every 6th layer global, local rope base 10000,
        # scores scaled by head_dim (query_pre_attn_scalar); the global layers' rope linearly scaled
        return save_tiny(
            out,
            tokenizer_dir,
            tf.Gemma3TextConfig,
            tf.Gemma3ForCausalLM,
            num_hidden_layers=6,
            head_dim=16,
            query_pre_attn_scalar=16,
            sliding_window=8,
            rope_parameters={
                "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            },
        )
    if kind == "qwen3_moe":
        return qwen3_moe(out, tokenizer_dir, vocab_size=VOCAB)
    if kind == "mixtral":
        return mixtral(out, tokenizer_dir, vocab_size=VOCAB)
    if kind == "qwen2_moe":
        return qwen2_moe(out, tokenizer_dir, vocab_size=VOCAB)
    return save_tiny(out, tokenizer_dir, tf.Qwen3Config, tf.Qwen3ForCausalLM, head_dim=32)


GGUF_ARCH = {
    "llama3": "llama",
    "mixtral": "llama",
    "qwen3_moe": "qwen3moe",
    "qwen2_moe": "qwen2moe",
}  # llama.cpp's arch of each kind


@pytest.mark.parametrize(
    "kind", ["qwen3", "qwen2", "llama", "llama3", "phi3", "qwen3_moe", "mixtral", "qwen2_moe", "gemma3"]
)
def test_gguf_loads_as_its_folder(kind, tmp_path, cache_dir, smollm_dir):
    folder = _build(kind, tmp_path / "hf", smollm_dir)
    gguf_path = write_gguf(folder, tmp_path / f"tiny-{kind}.gguf", GGUF_ARCH.get(kind, kind), smollm_dir)
    converted = resolve_model_dir(gguf_path)
    assert converted.is_relative_to(cache_dir)
    cfg, want = read_config(converted), read_config(folder)
    fields = ("model_type", "qk_norm", "attention_bias", "head_dim", "rotary_dim")
    moe = ("num_experts", "experts_per_token", "moe_intermediate_size", "norm_topk_prob", "dense_layers")
    moe += ("shared_expert_intermediate_size",)
    fields += ("layer_windows", "local_rope_theta", "hidden_act", "query_pre_attn_scalar")
    assert [getattr(cfg, f) for f in fields + moe] == [getattr(want, f) for f in fields + moe]
    ours = run_ours(DecoderModel(cfg, load_weights(converted), CPU, torch.float32), cfg, IDS, len(IDS) - 4)
    ref = run_ours(DecoderModel(want, load_weights(folder), CPU, torch.float32), want, IDS, len(IDS) - 4)
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(converted))  # the GGUF's tokenizer, rebuilt and saved
    if kind == "gemma3":  # rebuilt as a GemmaTokenizer (sentencepiece spaces), which this BPE slice is not:
        return  # Gemma's own GGUFs carry its sentencepiece vocabulary; the weights and config are checked above
    assert len(tok) == VOCAB and tok.decode(tok.encode(PROMPT)) == PROMPT


def test_an_unsupported_gguf_architecture_names_the_supported_ones(tmp_path, cache_dir):
    import gguf

    path = tmp_path / "tiny-gemma.gguf"
    writer = gguf.GGUFWriter(str(path), "gemma")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(
        ModelLoadError,
        match=r"unsupported GGUF architecture 'gemma' \(supported: llama, qwen2, qwen3, phi3, qwen2moe, qwen3moe, gemma3, "
        r"gpt-oss\)",
    ):
        resolve_model_dir(path)


def test_an_older_mixtral_gguf_with_one_tensor_per_expert(tmp_path, cache_dir, smollm_dir):
    folder = _build("mixtral", tmp_path / "hf", smollm_dir)
    gguf_path = write_gguf(folder, tmp_path / "tiny-mixtral-per-expert.gguf", "llama", smollm_dir, stack=False)
    from gguf import GGUFReader

    assert "blk.1.ffn_down.7.weight" in {t.name for t in GGUFReader(str(gguf_path)).tensors}
    converted = resolve_model_dir(gguf_path)
    cfg, want = read_config(converted), read_config(folder)
    assert (cfg.model_type, cfg.num_experts) == ("mixtral", 8)
    ours = run_ours(DecoderModel(cfg, load_weights(converted), CPU, torch.float32), cfg, IDS, len(IDS) - 4)
    ref = run_ours(DecoderModel(want, load_weights(folder), CPU, torch.float32), want, IDS, len(IDS) - 4)
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", ["qwen3_moe", "mixtral", "qwen2_moe"])
def test_q4_1_experts_run_from_the_ggufs_own_blocks(kind, tmp_path, cache_dir, smollm_dir, cpu_ops):
    """Stacked experts stored as Q4_1 (the rest float32): each expert's codes are read as they are
    (their dequantization is the converted folder's weights), `auto` picks q4 for them, and its
    greedy tokens agree with the float32 reference's."""
    from gguf import GGMLQuantizationType

    from runtime.model.decoder import load_model
    from runtime.model.families.registry import family_for_model_type
    from runtime.model.loader import read_gguf_codes, source_gguf
    from runtime.model.quant_codes import Int4Codes
    from tests.runtime.model.test_moe_families import MIN_AGREEMENT

    folder = _build(kind, tmp_path / "hf", smollm_dir)
    gguf_path = write_gguf(
        folder, tmp_path / f"tiny-{kind}-q4_1.gguf", GGUF_ARCH[kind], smollm_dir, GGMLQuantizationType.Q4_1
    )
    converted = resolve_model_dir(gguf_path)
    cfg = read_config(converted)
    codes = read_gguf_codes(source_gguf(converted))
    assert len(codes) == 3 * cfg.num_experts * cfg.num_layers
    weights = load_weights(converted)
    per_expert = family_for_model_type(cfg.model_type).weights(weights, cfg)  # the stacked experts split
    for name in ("model.layers.0.mlp.experts.0.gate_proj.weight", "model.layers.1.mlp.experts.7.down_proj.weight"):
        assert isinstance(codes[name], Int4Codes)
    for name, c in codes.items():
        assert torch.equal(c.dequantize(), per_expert[name]), name
    ref = DecoderModel(cfg, weights, CPU, torch.float32)
    model = load_model(converted, cfg, "auto", CPU, torch.float32, invariant_attention=True)
    assert model.weights == "q4", model.weights_reason
    ids = IDS + list(range(60, 100))
    exact = run_ours(ref, cfg, ids, len(IDS))
    ours = run_ours(model, cfg, ids, len(IDS))
    agree = float((ours.argmax(-1) == exact.argmax(-1)).float().mean())
    print(f"{kind} Q4_1 experts, q4: greedy agreement with fp32 {agree:.4f} over {len(ids)} positions")
    assert agree >= MIN_AGREEMENT
