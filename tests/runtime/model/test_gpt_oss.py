"""gpt-oss (runtime/model/families/gpt_oss.py) equals transformers' GptOssForCausalLM on tiny random
weights: 2 layers (window of 8 positions, then global), 4 experts top-2, YaRN rope as GptOssConfig's
default (factor 32 over 4096 positions: the ramp falls inside a 16-dim head), attention sinks,
router, expert and attention biases and a SwiGLU limit all made large enough here that each one
moves the logits. A prefill and decode steps, a mixed pass, a cached prefix longer than the
window, under the torch backend and the cpu kernel; the quantized formats' greedy tokens against
float32's (behind JUMPGATE_GPT_OSS_FORMATS=1); a GGUF of it; `jumpgate serve` on the folder
answering a strict json_schema request."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from runtime.attention import make_attention_backend
from runtime.model.config import ModelLoadError
from runtime.model.decoder import DecoderModel, load_model, load_weights
from runtime.model.families.registry import model_config
from runtime.model.loader import read_config
from tests.conftest import chat_ids
from tests.runtime.model.test_gemma3 import prefill_in_chunks
from tests.runtime.model.test_model_families import (
    PROMPT,
    assert_matches_transformers,
    assert_serves_a_strict_json_schema,
    hf_logits,
    run_ours,
    save_tiny,
)
from tests.runtime.model.test_moe_families import MIN_AGREEMENT, mixed_pass

CPU = torch.device("cpu")
WINDOW = 8
LIMIT = 1.0  # swiglu_limit: the tiny experts' gate/up values pass it
GPT_OSS = dict(
    head_dim=16,
    intermediate_size=32,
    num_local_experts=4,
    num_experts_per_tok=2,
    sliding_window=WINDOW,
    swiglu_limit=LIMIT,
    max_position_embeddings=512,
)


@pytest.fixture(scope="module")
def gpt_oss_dir(tmp_path_factory, smollm_dir) -> Path:
    """save_tiny's model with its sinks, biases and experts scaled up from their tiny inits."""
    from safetensors.torch import load_file, save_file
    from transformers import GptOssConfig, GptOssForCausalLM

    out = save_tiny(tmp_path_factory.mktemp("tiny-gpt-oss"), smollm_dir, GptOssConfig, GptOssForCausalLM, **GPT_OSS)
    g = torch.Generator().manual_seed(3)
    weights = load_file(str(out / "model.safetensors"))
    for name, w in weights.items():
        if name.endswith(("sinks", "_bias", "router.bias", "proj.bias")):
            weights[name] = torch.randn(w.shape, generator=g, dtype=w.dtype) * (2.0 if "sinks" in name else 0.5)
        elif name.endswith("gate_up_proj"):
            weights[name] = w * 4.0
    save_file(weights, str(out / "model.safetensors"))
    return out


def test_gpt_oss_reads_its_config(gpt_oss_dir):
    cfg = read_config(gpt_oss_dir)
    assert cfg.model_type == "gpt_oss" and cfg.layer_windows == (WINDOW, 0)
    assert cfg.attention_sinks and cfg.attention_bias and cfg.moe_softmax_after_topk
    assert (cfg.num_experts, cfg.experts_per_token, cfg.moe_intermediate_size) == (4, 2, 32)
    assert (cfg.swiglu_limit, cfg.swiglu_alpha) == (LIMIT, 1.702)
    assert cfg.rope_scaling["rope_type"] == "yarn" and cfg.rope_theta == 150000.0


@pytest.mark.parametrize("backend", ["torch", "auto"])
def test_gpt_oss_matches_transformers(gpt_oss_dir, tokenizer, backend):
    assert len(chat_ids(tokenizer, PROMPT)) > 2 * WINDOW
    assert_matches_transformers(gpt_oss_dir, tokenizer, attn=make_attention_backend(backend, CPU))


@pytest.mark.parametrize("backend", ["torch", "auto"])
def test_gpt_oss_mixed_pass_matches_transformers(gpt_oss_dir, tokenizer, backend):
    """One pass: a decode over a cached prefix beside a prefill, each row as transformers has it."""
    cfg = read_config(gpt_oss_dir)
    model = DecoderModel(cfg, load_weights(gpt_oss_dir), CPU, torch.float32)
    a, b = chat_ids(tokenizer, PROMPT), chat_ids(tokenizer, "A second request, prefilled beside the decode.")
    mixed = mixed_pass(model, cfg, a, b, make_attention_backend(backend, CPU))
    torch.testing.assert_close(mixed[0], hf_logits(gpt_oss_dir, a + [100])[-1], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(mixed[1:], hf_logits(gpt_oss_dir, b), atol=1e-4, rtol=1e-4)


def test_a_cached_prefix_longer_than_the_window_is_reused_exactly(gpt_oss_dir, tokenizer):
    cfg = read_config(gpt_oss_dir)
    model = DecoderModel(cfg, load_weights(gpt_oss_dir), CPU, torch.float32)
    ids = chat_ids(tokenizer, PROMPT)
    cut = 2 * WINDOW + 3
    attn = make_attention_backend("auto", CPU)
    whole = prefill_in_chunks(model, cfg, ids, 0, attn)[cut:]
    torch.testing.assert_close(prefill_in_chunks(model, cfg, ids, cut, attn), whole, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("part", ["sinks", "window", "limit"])
def test_each_gpt_oss_part_moves_the_logits(gpt_oss_dir, tokenizer, part):
    """Without its sinks, its window or its SwiGLU limit the model's logits move: the checks above
    would fail if one were ignored."""
    cfg = read_config(gpt_oss_dir)
    ids = chat_ids(tokenizer, PROMPT)
    weights = load_weights(gpt_oss_dir)
    if part == "sinks":
        weights = {k: w - 100.0 if k.endswith("sinks") else w for k, w in weights.items()}
    elif part == "window":
        cfg.layer_windows = ()
    else:
        cfg.swiglu_limit = 100.0
    model = DecoderModel(cfg, weights, CPU, torch.float32)
    ours = prefill_in_chunks(model, cfg, ids, 0, make_attention_backend("torch", CPU))
    assert (ours - hf_logits(gpt_oss_dir, ids)).abs().max() > 1e-2


@pytest.fixture(scope="module")
def fp32_greedy(gpt_oss_dir, tokenizer) -> tuple[list[int], int, torch.Tensor]:
    """(prompt + float32's greedy continuation of 24 tokens, prompt length, float32's logits of
    every row of it), under the engine's default attention backend: test_moe_families.py's
    greedy_agreement, with the reference run once for the three formats."""
    cfg = read_config(gpt_oss_dir)
    attn = make_attention_backend("auto", CPU)
    ref = DecoderModel(cfg, load_weights(gpt_oss_dir), CPU, torch.float32)
    ids = chat_ids(tokenizer, PROMPT)
    n_prompt = len(ids)
    for _ in range(24):
        ids.append(int(run_ours(ref, cfg, ids, len(ids), attn)[-1].argmax()))
    return ids, n_prompt, run_ours(ref, cfg, ids, n_prompt, attn)


# The formats' agreement costs ~25 s on the shared 2-core host (the float32 reference and three
# models): measured and logged (docs/perf-log.md), run again with JUMPGATE_GPT_OSS_FORMATS=1.
FORMATS = pytest.mark.skipif(
    os.environ.get("JUMPGATE_GPT_OSS_FORMATS") != "1", reason="set JUMPGATE_GPT_OSS_FORMATS=1 (about 25 s)"
)


@FORMATS
@pytest.mark.parametrize("fmt", ["bf16", "q8", "q4"])
def test_gpt_oss_quantized_formats_agree_with_float32(gpt_oss_dir, fmt, fp32_greedy, cpu_ops):
    """Top-1 agreement with float32 at every row of a prefill and of decode steps, teacher-forced
    along float32's greedy continuation (a folder's default format on CPU is float32 itself)."""
    ids, n_prompt, exact = fp32_greedy
    cfg = read_config(gpt_oss_dir)
    model = load_model(gpt_oss_dir, cfg, fmt, CPU, torch.float32, invariant_attention=True)
    assert model.weights == fmt and model.fused_ops is not None  # the fused ops pass the sinks too
    ours = run_ours(model, cfg, ids, n_prompt, make_attention_backend("auto", CPU))
    agree = float((ours.argmax(-1) == exact.argmax(-1)).float().mean())
    print(f"gpt-oss {fmt}: greedy agreement with fp32 {agree:.4f} over {len(ids)} rows")
    assert agree >= MIN_AGREEMENT


# ---- GGUF ------------------------------------------------------------------------------------------


def _llama_cpp_tensors(folder: Path, out: Path) -> Path:
    """`folder` with its tensors as convert_hf_to_gguf's GptOssModel hands them to the writer: each
    layer's experts de-interleaved into gate and up and stacked [experts, rows, cols] with their
    biases [experts, rows] (`mlp.experts.gate_proj.weight`, `.bias`, ...), the sinks as
    `self_attn.sinks.weight`; the rest as it is."""
    import re
    import shutil

    from safetensors.torch import load_file, save_file

    out.mkdir()
    for f in folder.iterdir():
        if f.name != "model.safetensors":
            shutil.copy(f, out / f.name)
    weights = {}
    for name, w in load_file(str(folder / "model.safetensors")).items():
        m = re.match(r"^(.*\.mlp\.experts)\.(gate_up_proj|down_proj)(_bias)?$", name)
        if m is None:
            weights[name + (".weight" if name.endswith(".sinks") else "")] = w  # llama.cpp names it so
        elif m[2] == "down_proj":
            weights[f"{m[1]}.down_proj.{'bias' if m[3] else 'weight'}"] = w if m[3] else w.transpose(1, 2)
        elif m[3]:
            weights[f"{m[1]}.gate_proj.bias"], weights[f"{m[1]}.up_proj.bias"] = w[:, 0::2], w[:, 1::2]
        else:
            weights[f"{m[1]}.gate_proj.weight"] = w[:, :, 0::2].transpose(1, 2)
            weights[f"{m[1]}.up_proj.weight"] = w[:, :, 1::2].transpose(1, 2)
    save_file({k: w.contiguous() for k, w in weights.items()}, str(out / "model.safetensors"))
    return out


@pytest.mark.parametrize("experts", ["F32", "MXFP4"])
def test_a_gguf_loads_as_its_folder(tmp_path, smollm_dir, monkeypatch, experts):
    """A GGUF of arch gpt-oss with llama.cpp's tensor names (gguf-py's map) and metadata (sliding
    window, YaRN factor and original context): its config and float32 logits equal the folder's.
    With its experts in MXFP4 (how gpt-oss GGUFs ship them), they load dequantized, equal to gguf's
    own dequantization of the blocks."""
    import numpy as np
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize
    from safetensors.torch import load_file
    from transformers import GptOssConfig, GptOssForCausalLM

    from runtime.model.loader import resolve_model_dir
    from tests.runtime.model.test_gguf_families import IDS, VOCAB, write_gguf

    monkeypatch.setenv("JUMPGATE_CACHE_DIR", str(tmp_path / "cache"))
    folder = save_tiny(tmp_path / "hf", smollm_dir, GptOssConfig, GptOssForCausalLM, **GPT_OSS, vocab_size=VOCAB)
    staged = _llama_cpp_tensors(folder, tmp_path / "staged")
    qtype = None if experts == "F32" else GGMLQuantizationType.MXFP4
    converted = resolve_model_dir(write_gguf(staged, tmp_path / "tiny-gpt-oss.gguf", "gpt-oss", smollm_dir, qtype))
    cfg, want = read_config(converted), read_config(folder)
    fields = ("model_type", "layer_windows", "rope_theta", "attention_bias", "num_experts")
    fields += ("experts_per_token", "moe_intermediate_size", "tie_word_embeddings")
    assert [getattr(cfg, f) for f in fields] == [getattr(want, f) for f in fields]
    rope = ("rope_type", "factor", "original_max_position_embeddings", "truncate")
    assert [cfg.rope_scaling[k] for k in rope] == [want.rope_scaling[k] for k in rope]
    ours = run_ours(DecoderModel(cfg, load_weights(converted), CPU, torch.float32), cfg, IDS, len(IDS) - 4)
    if qtype is not None:
        w = load_file(str(staged / "model.safetensors"))["model.layers.1.mlp.experts.down_proj.weight"].numpy()
        blocks = quantize(np.ascontiguousarray(w), qtype)
        got = load_weights(converted)["model.layers.1.mlp.experts.down_proj.weight"]
        assert torch.equal(got, torch.from_numpy(np.asarray(dequantize(blocks, qtype), dtype=np.float32)))
        assert not torch.equal(got, torch.from_numpy(w)) and bool(ours.isfinite().all())
        return
    ref = run_ours(DecoderModel(want, load_weights(folder), CPU, torch.float32), want, IDS, len(IDS) - 4)
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)


# ---- config.json refusals ---------------------------------------------------------------------------

BASE = {
    "model_type": "gpt_oss",
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 32,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 16,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
}


def test_a_bare_config_takes_gpt_oss_defaults():
    cfg = model_config(BASE)
    assert cfg.layer_windows == (128, 0, 128, 0) and cfg.rope_theta == 150000.0
    assert cfg.rope_scaling["factor"] == 32.0 and cfg.swiglu_limit == 7.0 and not cfg.tie_word_embeddings


@pytest.mark.parametrize(
    "fields,message",
    [
        ({"quantization_config": {"quant_method": "mxfp4"}}, "quantization_config 'mxfp4' is not supported"),
        ({"layer_types": ["sliding_attention"] * 3}, "layer_types must name 4 layers"),
        ({"layer_types": ["chunked_attention"] * 4}, "'chunked_attention'"),
        ({"num_experts_per_tok": 5}, "5 experts per token of 4"),
        ({"sliding_window": -1}, "sliding_window must be > 0"),
    ],
)
def test_what_gpt_oss_cannot_run_is_refused_in_one_line(fields, message):
    with pytest.raises(ModelLoadError, match=message):
        model_config({**BASE, **fields})


# ---- end to end -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gpt_oss_server(gpt_oss_dir, tmp_path_factory):
    from bench.harness.server_process import JumpgateServer

    srv = JumpgateServer(
        tmp_path_factory.mktemp("jumpgate-gpt-oss"), kv_pool_tokens=4096, extra_args=["--model", str(gpt_oss_dir)]
    )
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def test_serve_a_gpt_oss_folder_answers_a_strict_json_schema(gpt_oss_server):
    assert_serves_a_strict_json_schema(gpt_oss_server)
