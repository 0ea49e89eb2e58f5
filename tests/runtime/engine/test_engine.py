"""Engine behaviour with the real SmolLM2: batching, seeds, stops, limits, slot accounting."""

from __future__ import annotations

import asyncio
import json

import pytest

from runtime.api import EngineError, EngineStats, GenerateRequest
from runtime.decode.sampling import SamplingParams
from runtime.engine.engine import Engine
from runtime.model.config import ModelLoadError
from tests.conftest import chat_ids

pytestmark = pytest.mark.e2e

QUESTIONS = [
    "Tell me a joke.",
    "What is 2+2?",
    "Name three colors.",
    "Write a haiku about rain.",
    "Who wrote Hamlet?",
    "Explain gravity briefly.",
]


def greedy(n=24, **kw):
    return SamplingParams(max_new_tokens=n, temperature=0.0, **kw)


def test_generate_answers_a_real_question(engine_idle_check, tokenizer):
    r = engine_idle_check.generate(chat_ids(tokenizer, "What is the capital of France?"), greedy(20))
    assert "Paris" in r.text
    assert r.finish_reason == "stop"
    assert r.completion_tokens == len(r.token_ids)


def test_batched_decode_equals_each_request_alone(engine_idle_check, tokenizer):
    e = engine_idle_check
    prompts = [chat_ids(tokenizer, q) for q in QUESTIONS]
    batched = e.generate_many([GenerateRequest(p, greedy(24)) for p in prompts])
    for p, b in zip(prompts, batched):
        alone = e.generate(p, greedy(24))
        assert b.token_ids == alone.token_ids


def test_seed_reproduces_and_differs(engine_idle_check, tokenizer):
    e = engine_idle_check
    p = chat_ids(tokenizer, "Invent a name for a cat.")
    s = lambda seed: SamplingParams(max_new_tokens=16, temperature=1.0, top_p=0.95, top_k=50, min_p=0.01, seed=seed)
    a = e.generate_many([GenerateRequest(p, s(7)), GenerateRequest(p, s(8)), GenerateRequest(p, s(9))])
    b = e.generate(p, s(7))
    assert a[0].token_ids == b.token_ids
    assert len({tuple(x.token_ids) for x in a}) > 1


def test_stop_string_is_cut_and_not_included(engine_idle_check, tokenizer):
    e = engine_idle_check
    p = chat_ids(tokenizer, "What is the capital of France?")
    full = e.generate(p, greedy(20)).text
    assert "Paris" in full
    r = e.generate(p, greedy(20, stop=["Paris"]))
    assert r.finish_reason == "stop"
    assert r.text == full[: full.index("Paris")]
    # a stop string spanning token boundaries
    r2 = e.generate(p, greedy(20, stop=["of Fr"]))
    assert r2.text == full[: full.index("of Fr")]


def test_max_new_tokens_gives_length(engine_idle_check, tokenizer):
    r = engine_idle_check.generate(chat_ids(tokenizer, "Write a long story about a dragon."), greedy(5))
    assert r.finish_reason == "length" and r.completion_tokens == 5


def test_stats_is_a_typed_snapshot_and_info_describes_the_engine(engine_idle_check, tokenizer):
    engine = engine_idle_check
    before = engine.stats()
    from_engine_thread = engine.call(engine.stats).result(timeout=60)  # made there directly, no deadlock
    r = engine.generate(chat_ids(tokenizer, "Name a fruit."), greedy(3))
    after = engine.stats()
    assert isinstance(before, EngineStats) and from_engine_thread.generated_tokens == before.generated_tokens
    assert after.generated_tokens - before.generated_tokens == r.completion_tokens == 3
    assert after.requests_finished.get("length", 0) == before.requests_finished.get("length", 0) + 1
    assert after.as_dict()["requests_length"] == after.requests_finished["length"]
    info = engine.info
    assert (info.model_name, info.device, info.dtype) == ("SmolLM2-135M-Instruct", "cpu", "float32")
    assert info.kv_pool_tokens == after.kv_slots_total and info.vocab_size == engine.model_config.vocab_size


def test_prompt_too_long_is_refused_clearly(engine_idle_check):
    with pytest.raises(EngineError) as ei:
        engine_idle_check.generate([42] * 20000, greedy(4))
    assert ei.value.code == "context_length_exceeded"
    assert "20000 tokens" in ei.value.message


def test_bad_sampling_is_refused(engine_idle_check):
    with pytest.raises(EngineError) as ei:
        engine_idle_check.generate([42, 43], SamplingParams(top_p=0.0))
    assert ei.value.param == "top_p"
    with pytest.raises(EngineError):
        engine_idle_check.generate([], greedy(4))


def test_utf8_is_never_split(engine_idle_check, tokenizer):
    r = engine_idle_check.generate(chat_ids(tokenizer, "Reply with three emoji about the sea: 🌊🐟"), greedy(24))
    assert "\ufffd" not in r.text


def test_async_stream_and_abort_free_slots(engine_idle_check, tokenizer):
    e = engine_idle_check

    async def run():
        p = chat_ids(tokenizer, "Write a long story about a dragon.")
        events = []
        async for ev in e.submit(GenerateRequest(p, greedy(200))):
            events.append(ev)
            if len(events) == 3:
                break  # leaving early aborts the request
        full = [ev async for ev in e.submit(GenerateRequest(p, greedy(12)))]
        return events, full

    events, full = asyncio.run(run())
    assert len(events) == 3 and not events[-1].finished
    assert full[-1].finished and full[-1].finish_reason == "length"
    assert "".join(ev.text for ev in full)


def test_loader_errors_name_the_file(tmp_path, tiny_model_dir):
    with pytest.raises(ModelLoadError, match="no such model"):
        Engine(model=str(tmp_path / "missing"))
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text("{not json")
    (bad / "model.safetensors").write_bytes(b"x")
    (bad / "tokenizer.json").write_text("{}")
    with pytest.raises(ModelLoadError, match="config.json: not valid JSON"):
        Engine(model=str(bad))
    (bad / "config.json").write_text(json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(ModelLoadError, match="unsupported architecture"):
        Engine(model=str(bad))
    cfg = json.loads((tiny_model_dir / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="tokenizer.json: cannot load tokenizer"):
        Engine(model=str(bad))
    (bad / "tokenizer.json").write_bytes((tiny_model_dir / "tokenizer.json").read_bytes())
    with pytest.raises(ModelLoadError, match="model.safetensors: corrupt"):
        Engine(model=str(bad), kv_pool_tokens=1024)
    gg = tmp_path / "broken.gguf"
    gg.write_bytes(b"GGUF" + b"\0" * 64)
    with pytest.raises(ModelLoadError, match="broken.gguf"):
        Engine(model=str(gg))


@pytest.mark.slow  # transformers' own forward over the whole prompt: ~30 s on 2 AVX2 cores
def test_chunked_prefill_matches_transformers(smollm_dir, tokenizer):
    """A prompt spanning several prefill chunks (steps that carry no logits at all) must still
    write every position's KV: with fp32 weights greedy output equals transformers' generate, and
    in the default format (q4 on an AVX512-BF16 CPU, which drifts from fp32 within the bound of
    tests/runtime/model/test_weight_formats.py) chunked equals one-pass prefill."""
    import torch
    from transformers import AutoModelForCausalLM

    doc = " ".join(f"Ferry route {i} crossing takes {10 + i} minutes." for i in range(30))
    ids = chat_ids(tokenizer, "Which ferry route takes 18 minutes? Answer briefly.", system=doc)
    assert len(ids) > 3 * 64
    with Engine(kv_pool_tokens=4096, chunked_prefill_tokens=64, debug_invariants=True, weights="fp32") as e:
        ours = e.generate(ids, greedy(12, ignore_eos=True)).token_ids
    by_chunk = {}
    for chunk in (64, 4096):
        with Engine(kv_pool_tokens=4096, chunked_prefill_tokens=chunk, debug_invariants=True) as e:
            by_chunk[chunk] = e.generate(ids, greedy(12, ignore_eos=True)).token_ids
    assert by_chunk[64] == by_chunk[4096]
    hf = AutoModelForCausalLM.from_pretrained(str(smollm_dir), dtype=torch.float32).eval()
    ref = hf.generate(
        torch.tensor([ids]), max_new_tokens=12, min_new_tokens=12, do_sample=False, pad_token_id=tokenizer.eos_token_id
    )[0, len(ids) :].tolist()
    assert ours == ref
