"""The MoE families (runtime/model/families/qwen3_moe.py, mixtral.py; runtime/model/moe.py) equal
transformers' own classes on tiny random weights: 2-layer models with 8 experts, top 2, built with
the real config classes and saved as Hugging Face folders; float32 logits of a prefill, decode
steps over the cached prefix and a mixed pass (a decode row beside a prefill) within 1e-4, and the
quantized formats' greedy tokens against float32's."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from runtime.attention import TorchAttentionBackend, make_attention_backend
from runtime.forward_batch import ForwardBatch
from runtime.kvcache.pool import KVPool
from runtime.model.decoder import DecoderModel, load_model, load_weights
from runtime.model.loader import read_config
from tests.conftest import chat_ids
from tests.runtime.model.test_model_families import (
    PROMPT,
    assert_matches_transformers,
    hf_logits,
    run_ours,
    save_tiny,
)

CPU = torch.device("cpu")
MOE = dict(num_experts_per_tok=2, moe_intermediate_size=32, head_dim=32)
MIN_AGREEMENT = 0.97  # issue #45: a quantized format's greedy tokens against float32's


def qwen3_moe(out: Path, tokenizer_dir: Path, **overrides) -> Path:
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    fields = {**MOE, "num_experts": 8, "norm_topk_prob": True, **overrides}
    return save_tiny(out, tokenizer_dir, Qwen3MoeConfig, Qwen3MoeForCausalLM, **fields)


def qwen2_moe(out: Path, tokenizer_dir: Path, **overrides) -> Path:
    """Qwen1.5-MoE's shape: q/k/v biases and a shared expert beside the routed ones."""
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

    fields = {**MOE, "num_experts": 8, "shared_expert_intermediate_size": 64, **overrides}
    return save_tiny(out, tokenizer_dir, Qwen2MoeConfig, Qwen2MoeForCausalLM, **fields)


def mixtral(out: Path, tokenizer_dir: Path, **overrides) -> Path:
    from transformers import MixtralConfig, MixtralForCausalLM

    fields = {"num_local_experts": 8, "num_experts_per_tok": 2, "intermediate_size": 64, **overrides}
    return save_tiny(out, tokenizer_dir, MixtralConfig, MixtralForCausalLM, **fields)


@pytest.fixture(scope="module")
def qwen3_moe_dir(tmp_path_factory, smollm_dir) -> Path:
    return qwen3_moe(tmp_path_factory.mktemp("tiny-qwen3-moe"), smollm_dir)


@pytest.fixture(scope="module")
def mixtral_dir(tmp_path_factory, smollm_dir) -> Path:
    return mixtral(tmp_path_factory.mktemp("tiny-mixtral"), smollm_dir)


@pytest.fixture(scope="module")
def qwen2_moe_dir(tmp_path_factory, smollm_dir) -> Path:
    return qwen2_moe(tmp_path_factory.mktemp("tiny-qwen2-moe"), smollm_dir)


@pytest.fixture(params=["qwen3_moe", "mixtral", "qwen2_moe"])
def moe_dir(request) -> Path:
    return request.getfixturevalue(f"{request.param}_dir")


def test_qwen3_moe_matches_transformers(qwen3_moe_dir, tokenizer):
    cfg = assert_matches_transformers(qwen3_moe_dir, tokenizer)
    assert (cfg.model_type, cfg.num_experts, cfg.experts_per_token, cfg.moe_intermediate_size) == (
        "qwen3_moe",
        8,
        2,
        32,
    )
    assert cfg.qk_norm and cfg.norm_topk_prob and cfg.dense_layers == ()


def test_qwen3_moe_without_renormalizing_and_with_a_dense_layer(tmp_path, smollm_dir, tokenizer):
    """transformers' defaults: top-k probabilities as they are; `mlp_only_layers` keeps layer 1 dense."""
    d = qwen3_moe(tmp_path / "hf", smollm_dir, norm_topk_prob=False, mlp_only_layers=[1])
    cfg = assert_matches_transformers(d, tokenizer)
    assert not cfg.norm_topk_prob and cfg.dense_layers == (1,)


def test_mixtral_matches_transformers(mixtral_dir, tokenizer):
    assert "model.layers.0.block_sparse_moe.experts.7.w2.weight" in load_weights(mixtral_dir)
    cfg = assert_matches_transformers(mixtral_dir, tokenizer)
    assert (cfg.model_type, cfg.num_experts, cfg.experts_per_token, cfg.moe_intermediate_size) == ("mixtral", 8, 2, 64)


def test_qwen2_moe_shared_expert_matches_transformers(qwen2_moe_dir, tokenizer):
    assert "model.layers.0.mlp.shared_expert_gate.weight" in load_weights(qwen2_moe_dir)
    cfg = assert_matches_transformers(qwen2_moe_dir, tokenizer)
    assert (cfg.shared_expert_intermediate_size, cfg.attention_bias, cfg.norm_topk_prob) == (64, True, False)


@pytest.mark.parametrize("kind", ["qwen3_moe", "mixtral"])
def test_a_checkpoint_of_stacked_experts_loads_too(kind, request, tmp_path, tokenizer):
    """transformers >= 5 holds each layer's experts stacked (`mlp.experts.gate_up_proj` [E, 2I, H],
    gate rows first, and `down_proj` [E, H, I]); a checkpoint saved from its state_dict has those."""
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    folder = request.getfixturevalue(f"{kind}_dir")
    state = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).state_dict()
    assert state["model.layers.0.mlp.experts.gate_up_proj"].dim() == 3
    for f in folder.iterdir():
        if f.suffix != ".safetensors":
            (tmp_path / f.name).write_bytes(f.read_bytes())
    save_file(
        {k: v.contiguous() for k, v in state.items() if k != "lm_head.weight"}, str(tmp_path / "model.safetensors")
    )
    cfg = read_config(tmp_path)
    ids = chat_ids(tokenizer, PROMPT)
    ours = run_ours(DecoderModel(cfg, load_weights(tmp_path), CPU, torch.float32), cfg, ids, len(ids))
    torch.testing.assert_close(ours, hf_logits(folder, ids), atol=1e-4, rtol=1e-4)


def test_moe_under_the_engines_default_attention_backend(moe_dir, tokenizer):
    assert_matches_transformers(moe_dir, tokenizer, attn=make_attention_backend("auto", CPU))


def mixed_pass(model: DecoderModel, cfg, a: list[int], b: list[int], attn) -> torch.Tensor:
    """Prefill a alone; then one pass where a decodes token 100 over its cached prefix and b is
    prefilled: logits of a's decode row, then of every row of b."""
    kv = KVPool(cfg.num_layers, 256, cfg.num_kv_heads, cfg.head_dim)
    sa = kv.allocator.alloc(len(a))
    model.forward(
        ForwardBatch(torch.tensor(a), torch.arange(len(a)), sa, [len(a)], [len(a)], [sa], torch.tensor([len(a) - 1])),
        kv,
        attn,
    )
    s_new, sb = kv.allocator.alloc(1), kv.allocator.alloc(len(b))
    return model.forward(
        ForwardBatch(
            torch.tensor([100] + b),
            torch.tensor([len(a)] + list(range(len(b)))),
            torch.cat([s_new, sb]),
            [1, len(b)],
            [len(a) + 1, len(b)],
            [torch.cat([sa, s_new]), sb],
            torch.arange(1 + len(b)),
        ),
        kv,
        attn,
    )


def test_a_mixed_pass_matches_transformers(moe_dir, tokenizer):
    """One pass: request a decodes a token over its cached prefix, request b is prefilled; the
    experts of both run grouped, and each row equals transformers' logits of its sequence."""
    cfg = read_config(moe_dir)
    model = DecoderModel(cfg, load_weights(moe_dir), CPU, torch.float32)
    a, b = chat_ids(tokenizer, PROMPT), chat_ids(tokenizer, "A second request, prefilled beside the decode.")
    mixed = mixed_pass(model, cfg, a, b, TorchAttentionBackend())
    torch.testing.assert_close(mixed[0], hf_logits(moe_dir, a + [100])[-1], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(mixed[1:], hf_logits(moe_dir, b), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("fmt", ["q8", "q4"])
def test_quantized_moe_rows_do_not_depend_on_the_batch(moe_dir, fmt, tokenizer, cpu_ops):
    """Under the batch-invariant formats and attention backend, a MoE model's rows in a mixed pass
    equal, bit for bit, the same rows computed alone (the engine's equalities: a batch equals each
    request alone, a cache hit equals a recompute)."""
    cfg = read_config(moe_dir)
    model = load_model(moe_dir, cfg, fmt, CPU, torch.float32, invariant_attention=True)
    attn = make_attention_backend("auto", CPU)
    a, b = chat_ids(tokenizer, PROMPT), chat_ids(tokenizer, "A second request, prefilled beside the decode.")
    mixed = mixed_pass(model, cfg, a, b, attn)
    alone_a = run_ours(model, cfg, a + [100], len(a), attn)[-1]
    alone_b = run_ours(model, cfg, b, len(b), attn)
    assert torch.equal(mixed[0], alone_a) and torch.equal(mixed[1:], alone_b)


def test_the_experts_of_a_pass_run_one_matmul_each(qwen3_moe_dir, tokenizer):
    """The (token, expert) pairs are grouped by expert: an active expert's gate_up runs once per
    pass with all its rows; the rows add up to tokens x top-k."""
    cfg = read_config(qwen3_moe_dir)
    model = DecoderModel(cfg, load_weights(qwen3_moe_dir), CPU, torch.float32)
    moe = model.layers[0].moe
    calls: list[int] = []

    class Counting:
        def __init__(self, lin):
            self.lin = lin

        def __call__(self, x):
            calls.append(x.shape[0])
            return self.lin(x)

    moe.experts = [(Counting(gate_up), down) for gate_up, down in moe.experts]
    ids = chat_ids(tokenizer, PROMPT)
    run_ours(model, cfg, ids, len(ids))
    assert 1 < len(calls) <= cfg.num_experts and sum(calls) == len(ids) * cfg.experts_per_token


def test_moe_runs_the_python_layer_loop(qwen3_moe_dir, cpu_ops):
    """The one-call C++ layer loop has no routing step: a MoE model's fused formats leave it off."""
    cfg = read_config(qwen3_moe_dir)
    model = load_model(qwen3_moe_dir, cfg, "q8", CPU, torch.float32, invariant_attention=True)
    assert model.fused_ops is not None and model.layer_loop_spec() is None and model.layer_loop is None
    assert model.layers[0].moe.loop_spec() is None and not model.graph_capturable


def greedy_agreement(moe_dir: Path, fmt: str, tokenizer) -> float:
    """Top-1 agreement with float32 at every position of a prefill and of decode steps, teacher-forced
    along float32's own greedy continuation, under the engine's default attention backend."""
    cfg = read_config(moe_dir)
    attn = make_attention_backend("auto", CPU)
    ref = DecoderModel(cfg, load_weights(moe_dir), CPU, torch.float32)
    ids = chat_ids(tokenizer, PROMPT)
    n_prompt = len(ids)
    for _ in range(24):  # float32's greedy continuation
        ids.append(int(run_ours(ref, cfg, ids, len(ids), attn)[-1].argmax()))
    model = load_model(moe_dir, cfg, fmt, CPU, torch.float32, invariant_attention=True)
    assert model.weights == fmt
    exact = run_ours(ref, cfg, ids, n_prompt, attn)
    ours = run_ours(model, cfg, ids, n_prompt, attn)
    return float((ours.argmax(-1) == exact.argmax(-1)).float().mean())


@pytest.mark.parametrize("fmt", ["bf16", "q8", "q4"])
def test_bf16_q8_q4_experts_agree_with_float32(moe_dir, fmt, tokenizer, cpu_ops):
    agree = greedy_agreement(moe_dir, fmt, tokenizer)
    print(f"{moe_dir.name} {fmt}: greedy agreement with fp32 {agree:.4f}")
    assert agree >= MIN_AGREEMENT


# ---- end to end -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def qwen3_moe_server(qwen3_moe_dir, tmp_path_factory):
    """`jumpgate serve --model <tiny Qwen3-MoE folder>`: the real CLI and runtime on a MoE family."""
    from bench.harness.server_process import JumpgateServer

    srv = JumpgateServer(
        tmp_path_factory.mktemp("jumpgate-qwen3-moe"), kv_pool_tokens=4096, extra_args=["--model", str(qwen3_moe_dir)]
    )
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def test_serve_a_qwen3_moe_folder_answers_a_strict_json_schema(qwen3_moe_server):
    """Random weights, so what is written is noise; the grammar still forces valid JSON of the schema."""
    import json

    import jsonschema

    from tests.conftest import openai_client

    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 12}, "n": {"type": "integer"}},
        "required": ["name", "n"],
        "additionalProperties": False,
    }
    client = openai_client(qwen3_moe_server)
    model = client.models.list().data[0].id
    resp = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Name and n, as JSON."}],
        max_tokens=40,
        response_format={"type": "json_schema", "json_schema": {"name": "t", "strict": True, "schema": schema}},
    )
    jsonschema.validate(json.loads(resp.choices[0].message.content), schema)
    assert resp.choices[0].finish_reason == "stop"
