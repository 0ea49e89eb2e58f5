"""Fuzzing: schemathesis against the app's own OpenAPI document (FakeEngine + real GrammarService),
and Hypothesis-generated JSON schemas through the tiny-model engine under strict grammars.

Both are bounded (a fixed number of examples, no deadline) so the module stays fast; a failing
example is printed by Hypothesis and can be replayed.
"""

from __future__ import annotations

import json
import time

import jsonschema
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from gateway.app import create_app
from gateway.settings import Settings
from grammar import GrammarService, GrammarSpec, GrammarSpecError
from runtime.api import GenerateRequest
from runtime.decode.sampling import SamplingParams
from runtime.engine.engine import Engine
from tests.conftest import chat_ids
from tests.fake_engine import FakeEngine

OPENAPI_PATH = "/docs/openapi.json"

# --------------------------------------------------------------------------- schemathesis


@pytest.fixture(scope="module")
def fuzz_app(tokenizer, gateway_grammar, tmp_path_factory):
    engine = FakeEngine(tokenizer)
    app = create_app(engine, gateway_grammar, Settings(registry_dir=str(tmp_path_factory.mktemp("fuzz-registry"))))
    return app


# Every operation of the OpenAPI document (checked below, so a new route is not silently skipped).
OPERATIONS = [
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/cache/explain"),
    ("GET", "/v1/models"),
    ("GET", "/v1/models/{model_id}"),
    ("GET", "/v1/schemas"),
    ("POST", "/v1/schemas"),
    ("GET", "/v1/schemas/{schema_id}"),
    ("DELETE", "/v1/schemas/{schema_id}"),
    ("POST", "/v1/schemas/check"),
    ("GET", "/health"),
    ("GET", "/metrics"),
    ("POST", "/v1/responses"),
    ("GET", "/v1/responses/{response_id}"),
    ("DELETE", "/v1/responses/{response_id}"),
    ("POST", "/v1/files"),
    ("GET", "/v1/files"),
    ("GET", "/v1/files/{file_id}"),
    ("DELETE", "/v1/files/{file_id}"),
    ("GET", "/v1/files/{file_id}/content"),
    ("POST", "/v1/batches"),
    ("GET", "/v1/batches"),
    ("GET", "/v1/batches/{batch_id}"),
    ("POST", "/v1/batches/{batch_id}/cancel"),
    ("POST", "/v1/messages"),
    ("POST", "/v1/messages/count_tokens"),
]
POSITIVE, NEGATIVE = schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE
# valid input for every operation; invalid bodies where there is a body (a string path parameter
# has no invalid value, so schemathesis has nothing negative to generate for the others)
# (a multipart upload and a cancel declare no JSON body: nothing negative either)
NO_JSON_BODY = {("POST", "/v1/files"), ("POST", "/v1/batches/{batch_id}/cancel")}
CASES = [(m, p, POSITIVE) for m, p in OPERATIONS] + [
    (m, p, NEGATIVE) for m, p in OPERATIONS if m == "POST" and (m, p) not in NO_JSON_BODY
]


@pytest.fixture(scope="module")
def api_schema(fuzz_app):
    return schemathesis.openapi.from_asgi(OPENAPI_PATH, fuzz_app)


def test_the_fuzzed_operations_are_all_of_them(api_schema):
    found = {(op.ok().method.upper(), op.ok().path) for op in api_schema.get_all_operations()}
    assert found == set(OPERATIONS)


def _check_response(case, response) -> None:
    assert response.status_code < 500, (case.method, case.path, case.body, response.status_code, response.text[:500])
    if response.status_code >= 400:  # every refusal is an OpenAI error object (Anthropic's on /v1/messages)
        body = response.json()
        if case.path.startswith("/v1/messages"):
            assert set(body) == {"type", "error"} and body["type"] == "error" and body["error"]["message"], body
        else:
            assert set(body) == {"error"} and body["error"]["message"], body


@pytest.mark.parametrize("method,path,mode", CASES, ids=[f"{m} {p} {mode.value}" for m, p, mode in CASES])
def test_no_operation_answers_5xx_or_crashes(api_schema, method, path, mode):
    strategy = api_schema[path][method].as_strategy(generation_mode=mode)
    calls = []

    @given(case=strategy)
    @settings(
        max_examples=25,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        phases=[Phase.explicit, Phase.generate],
        database=None,
        derandomize=True,
    )
    def run(case):
        started = time.monotonic()
        response = case.call()
        calls.append(response.status_code)
        _check_response(case, response)
        assert time.monotonic() - started < 30

    run()
    assert calls


def test_fuzzing_left_nothing_in_flight(fuzz_app):
    # runs after the fuzz cases (same module app): every permit was given back
    assert fuzz_app.state.services.limiter.in_flight == 0


# --------------------------------------------------------------------------- generated schemas through the engine


def _names():
    return st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=8)


def _leaf():
    bound = st.integers(min_value=-1000, max_value=1000)
    string = st.builds(
        lambda lo, span: {"type": "string", "minLength": lo, "maxLength": lo + span},
        st.integers(0, 3),
        st.integers(0, 10),
    )
    bad_string = st.builds(lambda hi: {"type": "string", "minLength": hi + 1, "maxLength": hi}, st.integers(0, 5))
    integer = st.builds(lambda a, b: {"type": "integer", "minimum": min(a, b), "maximum": max(a, b)}, bound, bound)
    bad_integer = st.builds(lambda a: {"type": "integer", "minimum": a + 1, "maximum": a}, bound)  # unsatisfiable
    enum = st.one_of(
        st.lists(st.text(alphabet="abcxyz ", min_size=1, max_size=6), min_size=1, max_size=5, unique=True),
        st.lists(st.integers(-50, 50), min_size=1, max_size=5, unique=True),
    ).map(lambda values: {"enum": values})
    good = st.one_of(
        string, integer, enum, st.just({"type": "boolean"}), st.just({"type": "number"}), st.just({"type": "null"})
    )
    unsatisfiable = st.one_of(bad_integer, bad_string, st.just({"enum": []}))
    # about one leaf in twelve can match nothing: the grammar service must refuse those clearly
    return st.integers(0, 11).flatmap(lambda i: unsatisfiable if i == 0 else good)


def _schema(children):
    array = st.builds(
        lambda items, lo, span: {"type": "array", "items": items, "minItems": lo, "maxItems": lo + span},
        children,
        st.integers(0, 1),
        st.integers(0, 2),
    )
    obj = st.dictionaries(_names(), children, min_size=1, max_size=4).flatmap(
        lambda props: st.lists(st.sampled_from(sorted(props)), unique=True).map(
            lambda required: {
                "type": "object",
                "properties": props,
                "required": required,
                "additionalProperties": False,
            }
        )
    )
    return st.one_of(array, obj)


json_schemas = st.recursive(_leaf(), _schema, max_leaves=8).map(
    lambda s: (
        s
        if s.get("type") == "object"
        else {"type": "object", "properties": {"value": s}, "required": ["value"], "additionalProperties": False}
    )
)


@pytest.fixture(scope="module")
def tiny_engine(tiny_model_dir):
    engine = Engine(model=str(tiny_model_dir), kv_pool_tokens=8192, debug_invariants=True).start()
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def engine_grammar(tiny_engine):
    service = GrammarService(
        tiny_engine.tokenizer,
        tiny_engine.model_config.vocab_size,
        compile_timeout_s=20,
        stop_token_ids=list(tiny_engine.info.eos_token_ids),
    )
    yield service
    service.close()


# found by this test: xgrammar let a raw \x01 into a length-bounded string (invalid JSON)
CONTROL_CHARACTER_CASE = {
    "type": "object",
    "properties": {"_": {"type": "string", "minLength": 0, "maxLength": 2}},
    "required": [],
    "additionalProperties": False,
}


@given(schema=json_schemas)
@example(schema=CONTROL_CHARACTER_CASE)
@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_generated_schemas_give_valid_output_or_a_clear_refusal(schema, tiny_engine, engine_grammar, tokenizer):
    spec = GrammarSpec.json_schema(schema, strict=True)
    try:
        handle = engine_grammar.compile(spec)
    except GrammarSpecError as e:
        assert e.message and e.param == "response_format", e
        return
    prompt = chat_ids(tokenizer, "Answer in JSON.", system="Respond with JSON only.")
    request = GenerateRequest(
        prompt, SamplingParams(max_new_tokens=160, temperature=0.0), constraint=handle, strict=True
    )
    result = tiny_engine.generate_many([request], timeout=120)[0]
    assert result.finish_reason in ("stop", "length"), result
    try:
        value = json.loads(result.text)
    except json.JSONDecodeError as e:
        raise AssertionError(
            f"not JSON ({result.finish_reason}, {result.completion_tokens} tokens): "
            f"{result.text!r} for {json.dumps(schema)}"
        ) from e
    jsonschema.validate(value, schema, cls=jsonschema.Draft202012Validator)


def test_engine_is_idle_after_the_generated_schemas(tiny_engine):
    stats = tiny_engine.stats()
    assert stats.running_requests == 0 and stats.kv_slots_request_only == 0, stats
    tiny_engine.call(tiny_engine.check_invariant).result(timeout=30)
