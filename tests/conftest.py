"""Shared fixtures: the real SmolLM2 (loaded once per session) and a tiny random-weight Llama that
uses the real SmolLM2 tokenizer (fast unit tests of the runtime)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch


@pytest.fixture(scope="session")
def smollm_dir() -> Path:
    from runtime.loader import resolve_model_dir

    return resolve_model_dir()


@pytest.fixture(scope="session")
def tokenizer(smollm_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm_dir))


def make_tiny_llama(out: Path, tokenizer_dir: Path, **overrides) -> Path:
    """A 2-layer random Llama with the SmolLM2 vocabulary, saved as a Hugging Face folder."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = dict(
        vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
        rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2,
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


@pytest.fixture(scope="session")
def real_engine(smollm_dir):
    """The real SmolLM2 through the real runtime, shared by the whole session."""
    from runtime.engine import Engine

    engine = Engine(kv_pool_tokens=16384, debug_invariants=True).start()
    yield engine
    engine.shutdown()


@pytest.fixture
def engine_idle_check(real_engine):
    """After the test: nothing running and no slot held outside the prefix cache."""
    yield real_engine
    stats = real_engine.call(real_engine.stats).result(timeout=60)
    assert stats["running_requests"] == 0
    assert stats["kv_slots_request_only"] == 0, stats
    real_engine.call(real_engine.check_invariant).result(timeout=60)


def chat_ids(tokenizer, user: str, system: str | None = None) -> list[int]:
    msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
    out = tokenizer.apply_chat_template(msgs, add_generation_prompt=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def write_json(path: Path, obj) -> Path:
    path.write_text(json.dumps(obj))
    return path
