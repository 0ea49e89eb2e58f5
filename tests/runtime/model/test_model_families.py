"""Each model family (runtime/model/families/) equals transformers' own class on tiny random weights: a
2-layer model built with the real config class, saved as a Hugging Face folder, loaded by Jumpgate's
loader; logits of a prefill and of decode steps through the runtime's forward pass, in float32."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from runtime.attention import TorchAttentionBackend, make_attention_backend
from runtime.forward_batch import ForwardBatch
from runtime.kvcache.pool import KVPool
from runtime.model.config import ModelConfig, ModelLoadError
from runtime.model.decoder import DecoderModel, load_model, load_weights
from runtime.model.families.registry import model_config
from runtime.model.loader import read_config
from tests.conftest import chat_ids

CPU = torch.device("cpu")
TINY = dict(
    vocab_size=49152,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    bos_token_id=1,
    eos_token_id=2,
)
PROMPT = "Families of models share one decoder; each one differs a little."
DECODE_STEPS = 4


def save_tiny(out: Path, tokenizer_dir: Path, config_cls, model_cls, **overrides) -> Path:
    """A tiny random model of a transformers class, saved with the SmolLM2 tokenizer. Norm weights
    are random too (they are ones at init, which would hide a norm read from the wrong tensor)."""
    torch.manual_seed(0)
    model = model_cls(config_cls(**{**TINY, **overrides})).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.5 * torch.randn_like(p))
        model.lm_head.weight.mul_(8.0)  # a wider logits spread, as conftest's tiny llama
    model.save_pretrained(str(out), safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json"):
        if (tokenizer_dir / name).exists():
            shutil.copy(tokenizer_dir / name, out / name)
    return out


def hf_logits(model_dir: Path, ids: list[int]) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0]


def run_ours(model: DecoderModel, cfg: ModelConfig, ids: list[int], n_prompt: int, attn=None) -> torch.Tensor:
    """Logits of every prompt row (one prefill pass), then one decode pass per later token, as
    generation runs them: rows 0 .. len(ids)-1."""
    attn = attn or TorchAttentionBackend()
    kv = KVPool(cfg.num_layers, len(ids) + 8, cfg.num_kv_heads, cfg.head_dim)
    slots = kv.allocator.alloc(len(ids))
    p = slots[:n_prompt]
    rows = [
        model.forward(
            ForwardBatch(
                torch.tensor(ids[:n_prompt]),
                torch.arange(n_prompt),
                p,
                [n_prompt],
                [n_prompt],
                [p],
                torch.arange(n_prompt),
            ),
            kv,
            attn,
        )
    ]
    for pos in range(n_prompt, len(ids)):
        rows.append(
            model.forward(
                ForwardBatch(
                    torch.tensor([ids[pos]]),
                    torch.tensor([pos]),
                    slots[pos : pos + 1],
                    [1],
                    [pos + 1],
                    [slots[: pos + 1]],
                    torch.tensor([0]),
                ),
                kv,
                attn,
            )
        )
    return torch.cat(rows)


def assert_matches_transformers(model_dir: Path, tokenizer, attn=None) -> ModelConfig:
    ids = chat_ids(tokenizer, PROMPT)
    assert len(ids) >= 20
    ref = hf_logits(model_dir, ids + [int(t) for t in range(100, 100 + DECODE_STEPS)])
    ids = ids + list(range(100, 100 + DECODE_STEPS))
    cfg = read_config(model_dir)
    model = DecoderModel(cfg, load_weights(model_dir), CPU, torch.float32)
    ours = run_ours(model, cfg, ids, len(ids) - DECODE_STEPS, attn)
    torch.testing.assert_close(ours, ref, atol=1e-4, rtol=1e-4)
    return cfg


# ---- Qwen3 --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory, smollm_dir) -> Path:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    # head_dim 32 with hidden 64 / 4 heads: q/k/v are wider than the residual stream, as in Qwen3
    return save_tiny(tmp_path_factory.mktemp("tiny-qwen3"), smollm_dir, Qwen3Config, Qwen3ForCausalLM, head_dim=32)


def test_qwen3_matches_transformers(qwen3_dir, tokenizer):
    cfg = assert_matches_transformers(qwen3_dir, tokenizer)
    assert (cfg.qk_norm, cfg.attention_bias, cfg.head_dim) == (True, False, 32)


def test_qwen3_under_the_engines_default_attention_backend(qwen3_dir, tokenizer):
    """The cpu backend (C++ paged attention where it builds) sees the normed, rotated q/k as any model's."""
    assert_matches_transformers(qwen3_dir, tokenizer, attn=make_attention_backend("auto", CPU))


def test_qwen3_fused_cpu_path_applies_the_qk_norms(qwen3_dir, tokenizer, cpu_ops):
    """bf16 linear layers run the fused C++ ops layer by layer (the one-call layer loop has no q/k
    norm step, so it is off); their drift from fp32 stays that of bf16 activations."""
    cfg = read_config(qwen3_dir)
    fused = load_model(qwen3_dir, cfg, "bf16", CPU, torch.float32, invariant_attention=True)
    assert fused.fused_ops is not None and fused.layer_loop_spec() is None
    ref = DecoderModel(cfg, load_weights(qwen3_dir), CPU, torch.float32)
    ids = chat_ids(tokenizer, PROMPT) + list(range(100, 100 + DECODE_STEPS))
    attn = make_attention_backend("auto", CPU)
    ours, exact = (run_ours(m, cfg, ids, len(ids) - DECODE_STEPS, attn) for m in (fused, ref))
    assert (ours - exact).abs().max() < 0.05 * exact.abs().max()
    assert (ours.argmax(-1) == exact.argmax(-1)).float().mean() >= 0.9
    # without the norms the fused path would be far off: the check above can fail
    no_norm = DecoderModel(cfg, load_weights(qwen3_dir), CPU, torch.float32, fmt="bf16")
    for layer in no_norm.layers:
        layer.q_norm = torch.ones_like(layer.q_norm)
        layer.k_norm = torch.ones_like(layer.k_norm)
    off = run_ours(no_norm, cfg, ids, len(ids) - DECODE_STEPS, attn)
    assert (off - exact).abs().max() > 0.05 * exact.abs().max()


# ---- Phi-3 / Phi-4-mini ---------------------------------------------------------------------------


def _phi3_dir(tmp_path_factory, smollm_dir, name, **overrides) -> Path:
    from transformers import Phi3Config, Phi3ForCausalLM

    return save_tiny(
        tmp_path_factory.mktemp(name), smollm_dir, Phi3Config, Phi3ForCausalLM, pad_token_id=0, **overrides
    )


def test_phi3_fused_projections_match_transformers(tmp_path_factory, smollm_dir, tokenizer):
    d = _phi3_dir(tmp_path_factory, smollm_dir, "tiny-phi3")
    assert "model.layers.0.self_attn.qkv_proj.weight" in load_weights(d)
    assert_matches_transformers(d, tokenizer)


def longrope(n: int, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        "rope_type": "longrope",
        "short_factor": (1 + torch.rand(n, generator=g)).tolist(),
        "long_factor": (1 + 4 * torch.rand(n, generator=g)).tolist(),
    }


def test_phi3_longrope_matches_transformers_past_the_original_context(tmp_path_factory, smollm_dir, tokenizer):
    """Served context 256 > original 16, so the long factors and the attention factor apply (as
    transformers does once a sequence passes 16 tokens; the prompt here does)."""
    d = _phi3_dir(
        tmp_path_factory,
        smollm_dir,
        "tiny-phi3-longrope",
        max_position_embeddings=256,
        original_max_position_embeddings=16,
        rope_scaling=longrope(8, 1),
    )
    cfg = assert_matches_transformers(d, tokenizer)
    assert cfg.rope_scaling["rope_type"] == "longrope"


def test_phi4_mini_partial_rotary_matches_transformers(tmp_path_factory, smollm_dir, tokenizer):
    """Phi-4-mini's shape: rope on 3/4 of each head (12 of 16 dims) with longrope factors for them."""
    d = _phi3_dir(
        tmp_path_factory,
        smollm_dir,
        "tiny-phi4-mini",
        partial_rotary_factor=0.75,
        max_position_embeddings=256,
        original_max_position_embeddings=16,
        rope_scaling=longrope(6, 2),
    )
    cfg = assert_matches_transformers(d, tokenizer)
    assert (cfg.rotary_dim, cfg.head_dim) == (12, 16)


# ---- refusals -----------------------------------------------------------------------------------


def test_an_unsupported_model_type_names_the_supported_families():
    with pytest.raises(ModelLoadError) as e:
        model_config({"model_type": "falcon", "architectures": ["FalconForCausalLM"]})
    assert "falcon" in str(e.value)
    for supported in ("llama", "mistral", "qwen2", "qwen3", "phi3", "gemma3_text", "gpt_oss"):
        assert supported in str(e.value)


@pytest.mark.parametrize("model_type", ["falcon", "gemma3"])  # gemma3: the multimodal checkpoint
def test_serve_refuses_an_unsupported_family_in_one_line(model_type, tmp_path, smollm_dir):
    """`jumpgate serve --model <folder>` of a family Jumpgate does not run: exit 1 with one line on
    stderr naming it and the supported ones, no traceback."""
    import json
    import subprocess
    import sys

    from safetensors.torch import save_file

    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(smollm_dir / name, tmp_path / name)
    save_file({"model.embed_tokens.weight": torch.zeros(4, 4)}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type, "hidden_size": 64}))
    out = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "serve", "--model", str(tmp_path), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 1 and len(lines) == 1, out.stderr
    assert f"model_type={model_type!r}" in lines[0] and "qwen3_moe, mixtral" in lines[0]


# ---- end to end -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def qwen3_server(qwen3_dir, tmp_path_factory):
    """`jumpgate serve --model <tiny Qwen3 folder>`: the real CLI and runtime on a non-Llama family."""
    from bench.harness.server_process import JumpgateServer

    srv = JumpgateServer(
        tmp_path_factory.mktemp("jumpgate-qwen3"), kv_pool_tokens=4096, extra_args=["--model", str(qwen3_dir)]
    )
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def test_serve_a_qwen3_folder_answers_a_strict_json_schema(qwen3_server):
    assert_serves_a_strict_json_schema(qwen3_server)


def assert_serves_a_strict_json_schema(server) -> None:
    """Random weights, so what is written is noise; the grammar still forces valid JSON of the schema
    (tests/runtime/model/test_gemma3.py runs it on a Gemma 3 folder)."""
    import json

    import jsonschema

    from tests.conftest import openai_client

    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 12}, "ok": {"type": "boolean"}},
        "required": ["name", "ok"],
        "additionalProperties": False,
    }
    client = openai_client(server)
    model = client.models.list().data[0].id  # the folder's name
    resp = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Name and ok, as JSON."}],
        max_tokens=40,
        response_format={"type": "json_schema", "json_schema": {"name": "t", "strict": True, "schema": schema}},
    )
    jsonschema.validate(json.loads(resp.choices[0].message.content), schema)
    assert resp.choices[0].finish_reason == "stop"
