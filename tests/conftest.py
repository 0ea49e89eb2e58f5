"""Shared fixtures: the real SmolLM2 (loaded once per session) and a tiny random-weight Llama that
uses the real SmolLM2 tokenizer (fast unit tests of the runtime)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

# Without a GPU, Triton kernels run only under the Triton interpreter. It must be on before triton
# is first imported (triton.language binds its own @jit helpers, e.g. tl.zeros, at import) and
# before our kernel modules are; a session fixture importing transformers' Llama imports triton,
# so this is set here, before any test module or fixture runs. Nothing else uses triton on CPU.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session")
def cpu_ops():
    """torch.ops.jumpgate_cpu (runtime/cpu_kernels/), built once per machine; skips where it cannot be built."""
    from runtime.cpu_kernels import load_cpu_kernels

    module = load_cpu_kernels()
    if module is None:
        pytest.skip("the CPU kernels cannot be built here")
    return module


@pytest.fixture
def dot_scores_forced(cpu_ops):
    """The attention kernel's bf16 dot-product scores for one test on any CPU built with them: its
    AMX path off meanwhile (an AMX CPU takes AMX tiles otherwise); skips where they are not built."""
    if not cpu_ops.paged_attention_bf16_dot():
        pytest.skip("no bf16 dot-product attention scores (AVX512-BF16) in this build")
    was = cpu_ops.paged_attention_use_amx(False)
    yield
    cpu_ops.paged_attention_use_amx(was)


@pytest.fixture(scope="session")
def smollm_dir() -> Path:
    from runtime.model.loader import resolve_model_dir

    return resolve_model_dir()


@pytest.fixture(scope="session")
def tokenizer(smollm_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm_dir))


@pytest.fixture(scope="module")
def service(tokenizer, smollm_dir):
    """A GrammarService for the real tokenizer (memory cache only), one per test module: each
    module starts with an empty grammar cache and nothing learned by the draft splitter."""
    from grammar import GrammarService
    from runtime.model.loader import read_config

    svc = GrammarService(tokenizer, read_config(smollm_dir).vocab_size)
    yield svc
    svc.close()


def make_tiny_llama(out: Path, tokenizer_dir: Path, **overrides) -> Path:
    """A 2-layer random Llama with the SmolLM2 vocabulary, saved as a Hugging Face folder."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = dict(
        vocab_size=49152,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
    )
    cfg.update(overrides)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**cfg)).eval()
    with torch.no_grad():  # larger logits spread: greedy choices are clear-cut, not near-ties
        model.lm_head.weight.mul_(8.0)
    model.save_pretrained(str(out), safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json"):
        if (tokenizer_dir / name).exists():
            shutil.copy(tokenizer_dir / name, out / name)
    return out


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, smollm_dir) -> Path:
    return make_tiny_llama(tmp_path_factory.mktemp("tiny-llama"), smollm_dir)


OTHER_TOKEN = "<|jumpgate_other|>"  # what makes the other tokenizer's vocabulary (and fingerprint) differ


@pytest.fixture(scope="session")
def other_model_dir(tmp_path_factory, tokenizer) -> Path:
    """A tiny random Llama with another tokenizer: SmolLM2's plus one added token, so its
    fingerprint, vocabulary size and compiled grammars differ from the default model's (a second
    model sharing the default folders)."""
    from transformers import AutoTokenizer

    tokenizer_dir = tmp_path_factory.mktemp("other-tokenizer")
    other = AutoTokenizer.from_pretrained(tokenizer.name_or_path)
    other.add_tokens([OTHER_TOKEN])
    other.save_pretrained(str(tokenizer_dir))
    return make_tiny_llama(
        tmp_path_factory.mktemp("other-model"), tokenizer_dir, vocab_size=(len(other) + 63) // 64 * 64
    )


@pytest.fixture(scope="session")
def other_tokenizer(other_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(other_model_dir))


@pytest.fixture(scope="session")
def real_engine(smollm_dir):
    """The real SmolLM2 through the real runtime, shared by the whole session."""
    from runtime.engine.engine import Engine

    engine = Engine(kv_pool_tokens=16384, debug_invariants=True).start()
    yield engine
    engine.shutdown()


@pytest.fixture
def engine_idle_check(real_engine):
    """After the test: nothing running and no slot held outside the prefix cache."""
    yield real_engine
    stats = real_engine.stats()
    assert stats.running_requests == 0
    assert stats.kv_slots_request_only == 0, stats
    real_engine.call(real_engine.check_invariant).result(timeout=60)


@pytest.fixture
def formed_groups(monkeypatch) -> list:
    """Every shared-prefix group the model runner forms while the test runs (the real
    find_prefix_groups, observed)."""
    from runtime.model import runner as model_runner

    formed = []
    real = model_runner.find_prefix_groups

    def observed(*args, **kwargs):
        groups = real(*args, **kwargs)
        formed.extend(groups)
        return groups

    monkeypatch.setattr(model_runner, "find_prefix_groups", observed)
    return formed


def chat_ids(tokenizer, user: str, system: str | None = None) -> list[int]:
    msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
    out = tokenizer.apply_chat_template(msgs, add_generation_prompt=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def openai_client(server):
    """The official client for a test server (bench.harness.server_process.JumpgateServer): no retries, so
    a failure shows at once, and a timeout a CPU's slowest answer fits in."""
    import openai

    return openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0, timeout=180)


def write_json(path: Path, obj) -> Path:
    path.write_text(json.dumps(obj))
    return path


# ==== gateway unit tests: a scripted fake engine (owned by the gateway tests) =======================
# FakeEngine (tests/fake_engine.py) implements runtime.api.EngineClient with scripted replies, so the
# HTTP layer can be tested without model compute.


@pytest.fixture(scope="session")
def gateway_grammar(tokenizer):
    """One real GrammarService for the gateway tests (compiles are cached across tests), with
    check-and-roll-back off (`--value-retries 0`): the fake engine runs no matcher, so these tests
    see strict mode refuse what the mask alone does not enforce; with the check on (the default)
    see tests/grammar/checks/test_rollback_e2e.py and `rollback_gateway_client`."""
    from grammar.service.service import GrammarService

    service = GrammarService(tokenizer, len(tokenizer), value_retries=0)
    yield service
    service.close()


@pytest.fixture
def fake_engine(tokenizer):
    from tests.fake_engine import FakeEngine

    return FakeEngine(tokenizer)


@pytest.fixture
def gateway_client(fake_engine, gateway_grammar, tmp_path):
    """A Litestar TestClient over create_app(fake engine, real grammar service); pass settings
    fields as keyword arguments: `client = gateway_client(api_keys=["k"])`."""
    from litestar.testing import TestClient

    from gateway.app import create_app
    from gateway.settings import Settings

    clients = []

    def make(**fields):
        fields.setdefault("registry_dir", str(tmp_path / "registry"))
        client = TestClient(create_app(fake_engine, gateway_grammar, Settings(**fields)))
        client.__enter__()
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.__exit__(None, None, None)


# What the gateway tests send: the fake engine's model, a one-line chat, a tool.
MODEL = "SmolLM2-135M-Instruct"
USER = [{"role": "user", "content": "hi"}]
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def chat(client, **body):
    """POST a chat completion (MODEL and USER unless given)."""
    body.setdefault("model", MODEL)
    body.setdefault("messages", USER)
    return client.post("/v1/chat/completions", json=body)


# ==== end of the gateway section ====================================================================


@pytest.fixture(scope="session")
def jumpgate_server(tmp_path_factory):
    """One real `jumpgate serve` subprocess with the default model for every end-to-end test module
    that needs only the default flags (the model loads once, not once per module)."""
    from bench.harness.server_process import JumpgateServer

    srv = JumpgateServer(tmp_path_factory.mktemp("jumpgate-e2e"), kv_pool_tokens=16384)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()
