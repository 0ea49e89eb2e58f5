"""--attention-tiles end to end (the cpu attention kernel on AMX tiles; runtime/attention/cpu_backend.py).

The default (`auto`) takes tiles wherever they can run, at bf16 precision (`--attention-precision
auto`; `float32` the other run). With the real SmolLM2 in q4 on a CPU with AMX, at either
precision (or without AMX on AVX512-BF16, at bf16 precision: its dot-product scores), the engine keeps the equalities the batch-invariant kernel exists for: jump-forward `verify` gives `off`'s tokens, a prompt served from the prefix
cache gives the tokens it gave cold, and strict outputs validate. Elsewhere `on` is refused with
one log line, `auto` says nothing, and the engine runs as with `off` (tiny model). The kernel's own checks are in
tests/runtime/attention/test_cpu_attention.py; its drift from fp32 in tests/runtime/model/test_weight_formats.py.
"""

from __future__ import annotations

import json
import logging

import jsonschema
import pytest

from grammar import GrammarSpec
from runtime.api import GenerateRequest
from runtime.decode.sampling import SamplingParams
from tests.conftest import chat_ids

SYSTEM = "You are a JSON API. Reply with one compact JSON value only."
# House rules after the system line, long enough (~700 tokens) that every row of these requests
# sees more than the kernel's tiles_min_keys() (512) keys: the tile path, not the vector one
RULES = " ".join(
    f"Rule {i}: a reply names each field once, keeps numbers as numbers, and never adds a field the schema lacks."
    for i in range(1, 31)
)
SCHEMAS = {
    "person": {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "age": {"type": "integer"},
            "email": {"type": "string", "format": "email"},
        },
        "required": ["name", "age", "email"],
        "additionalProperties": False,
    },
    "order": {
        "type": "object",
        "properties": {
            "id": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
            "items": {
                "type": "array",
                "minItems": 1,
                "maxItems": 3,
                "items": {
                    "type": "object",
                    "properties": {"sku": {"type": "string"}, "qty": {"type": "integer", "minimum": 1}},
                    "required": ["sku", "qty"],
                    "additionalProperties": False,
                },
            },
            "status": {"enum": ["new", "paid", "shipped"]},
        },
        "required": ["id", "items", "status"],
        "additionalProperties": False,
    },
    "weather": {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "celsius": {"type": "number"},
            "sky": {"enum": ["clear", "cloudy", "rain", "snow"]},
        },
        "required": ["city", "celsius", "sky"],
        "additionalProperties": False,
    },
}
PROMPTS = {
    "person": "Make up a person with a name, an age and an email address.",
    "order": "Make up a small web-shop order with two items.",
    "weather": "Describe today's weather in Lisbon.",
}


@pytest.fixture(scope="module", params=["auto", "float32"])
def tiles_engine(smollm_dir, cpu_ops, request):
    from runtime.engine.engine import Engine

    amx = cpu_ops.int4_linear_amx()
    # without AMX the default (bf16) takes the dot-product scores; float32 there is the vector path
    if not amx and not (request.param == "auto" and cpu_ops.paged_attention_bf16_dot()):
        pytest.skip("no AMX tiles on this CPU")
    # the default (auto: tiles at bf16 precision), then tiles at float32 precision
    engine = Engine(kv_pool_tokens=8192, debug_invariants=True, attention_precision=request.param).start()
    banner = {"auto": "cpu-amx-bf16", "float32": "cpu-amx"}[request.param] if amx else "cpu-bf16-dot"
    assert engine.info.weights == "q4" and engine.info.attention_backend == banner
    yield engine
    engine.shutdown()


def _requests(service, tokenizer, mode):
    return [
        GenerateRequest(
            chat_ids(tokenizer, PROMPTS[name], SYSTEM + "\n\n" + RULES),
            SamplingParams(max_new_tokens=80, temperature=0.0),
            constraint=service.compile(GrammarSpec.json_schema(schema)),
            jump_forward=mode,
            strict=True,
        )
        for name, schema in SCHEMAS.items()
    ]


@pytest.mark.e2e
def test_verify_equals_off_and_the_cache_changes_no_token(tiles_engine, service, tokenizer, cpu_ops):
    requests = _requests(service, tokenizer, "off")
    assert min(len(r.prompt_ids) for r in requests) > cpu_ops.tiles_min_keys()  # every row on tiles
    off = tiles_engine.generate_many(requests, timeout=600)
    # the same prompts again: now all but their last token come from the prefix cache, and drafts
    # of forced text go in as several rows per pass
    verify = tiles_engine.generate_many(_requests(service, tokenizer, "verify"), timeout=600)
    assert all(r.cached_tokens > 0 for r in verify)
    for name, a, b in zip(SCHEMAS, off, verify):
        assert a.token_ids == b.token_ids, (name, a.text, b.text)
        assert a.finish_reason == b.finish_reason == "stop", (name, a.text)
        jsonschema.validate(json.loads(a.text), SCHEMAS[name])
    stats = tiles_engine.stats()
    assert stats.running_requests == 0 and stats.kv_slots_request_only == 0


def test_the_flag_is_refused_with_one_log_line_where_it_cannot_run(tiny_model_dir, caplog):
    from runtime.engine.engine import Engine

    greedy = SamplingParams(max_new_tokens=4, temperature=0.0, ignore_eos=True)
    outs = []
    for tiles in ("on", "auto", "off"):
        with caplog.at_level(logging.WARNING, logger="jumpgate.engine"):
            caplog.clear()
            engine = Engine(
                model=str(tiny_model_dir), device="cpu", weights="fp32", attention_tiles=tiles, kv_pool_tokens=256
            )
        try:
            refused = [r for r in caplog.records if "--attention-tiles: not used" in r.getMessage()]
            assert len(refused) == (1 if tiles == "on" else 0)  # auto falls back quietly
            assert engine.runner.attn.name in ("cpu", "torch")
            outs.append(engine.generate([5, 6, 7, 8], greedy).token_ids)
        finally:
            engine.shutdown()
    assert outs[0] == outs[1] == outs[2]
