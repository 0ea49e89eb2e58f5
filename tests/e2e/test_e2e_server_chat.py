"""End to end on the session's one real `jumpgate serve` (SmolLM2-135M on CPU): health, plain and
streamed chat, long prompts, every tool_choice, streamed tool calls, and structured output, driven by
the official `openai` client and raw httpx. Every generation is greedy with a small `max_tokens`."""

from __future__ import annotations

import importlib.util
import json
import re
import uuid
from typing import Any

import jsonschema
import pytest
from pydantic import BaseModel

from bench.harness.server_process import MODEL
from tests.e2e.e2e_server_helpers import CORPUS, EXAMPLES, TOOLS, WEATHER_Q, assert_openai_error, chat_body

pytestmark = pytest.mark.e2e

TOOL_PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


def check_tool_calls(message, *, allowed: set[str] | None = None) -> list[tuple[str, dict]]:
    """Every call has an id, a known name and JSON arguments valid for that tool's schema."""
    assert message.tool_calls, message
    out = []
    ids = set()
    for call in message.tool_calls:
        assert call.type == "function"
        assert call.id and call.id.startswith("call_") and call.id not in ids
        ids.add(call.id)
        name = call.function.name
        assert name in (allowed or TOOL_PARAMS), name
        args = json.loads(call.function.arguments)
        jsonschema.validate(args, TOOL_PARAMS[name])
        out.append((name, args))
    return out


def load_example(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --------------------------------------------------------------------------- basics


def test_health_and_models(server, client, http):
    assert http.get("/health").json() == {"status": "ok", "model": MODEL}
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL


def test_plain_chat(client):
    resp = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Name three colors."}],
        temperature=0,
        max_tokens=12,
    )
    assert resp.object == "chat.completion" and resp.id.startswith("chatcmpl-")
    choice = resp.choices[0]
    assert choice.message.role == "assistant"
    assert isinstance(choice.message.content, str) and choice.message.content.strip()
    assert choice.message.tool_calls is None
    assert choice.finish_reason in ("stop", "length")
    u = resp.usage
    assert u is not None and 0 < u.completion_tokens <= 12
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens
    assert u.prompt_tokens_details is not None and 0 <= u.prompt_tokens_details.cached_tokens < u.prompt_tokens


def test_streamed_chat_matches_non_streamed(client):
    msgs = [{"role": "user", "content": "Write one sentence about the sea."}]
    whole = client.chat.completions.create(model=MODEL, messages=msgs, temperature=0, max_tokens=16)
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=msgs,
            temperature=0,
            max_tokens=16,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    with_choices = [c for c in chunks if c.choices]
    assert with_choices[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in with_choices)
    assert text == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in with_choices if c.choices[0].finish_reason] == [
        whole.choices[0].finish_reason
    ]
    assert all(c.id == chunks[0].id and c.object == "chat.completion.chunk" for c in chunks)
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert last.usage.completion_tokens == whole.usage.completion_tokens
    assert last.usage.prompt_tokens == whole.usage.prompt_tokens
    assert all(c.usage is None for c in chunks[:-1])


def test_long_prompt_over_one_prefill_chunk(client):
    """A cold prompt longer than one prefill chunk (512 tokens) must be answered from its whole
    text (regression: a pass made only of mid-prompt chunks used to skip the forward, leaving those
    positions' KV unwritten and the answer garbage)."""
    rag = load_example("rag_cached")
    system = "Answer the passenger's question using only the handbook below. Be brief.\n\n" + rag.DOCUMENT
    msgs = [
        {"role": "system", "content": system},
        {"role": "user", "content": "How long does the Blue route crossing take?"},
    ]
    salt = {"cache_salt": uuid.uuid4().hex}  # a namespace of its own: the first request is cold
    cold = client.chat.completions.create(model=MODEL, messages=msgs, temperature=0, max_tokens=12, extra_body=salt)
    assert cold.usage.prompt_tokens > 512 and cold.usage.prompt_tokens_details.cached_tokens < 16
    # The answer quotes the handbook's Blue route line. transformers' fp32 greedy reference says
    # "The Blue route crossing takes 18 minutes."; the q4 default (auto on a CPU with native bf16)
    # says "The Blue route crossing is a 20-minute crossing", the route's frequency from the same
    # line: a quantization drift, not the unwritten-KV bug, whose answers do not quote the text.
    answer = cold.choices[0].message.content
    assert "Blue route" in answer and ("18 minutes" in answer or "20-minute" in answer), answer
    warm = client.chat.completions.create(model=MODEL, messages=msgs, temperature=0, max_tokens=12, extra_body=salt)
    assert warm.usage.prompt_tokens_details.cached_tokens > 512
    assert warm.choices[0].message.content == cold.choices[0].message.content


# --------------------------------------------------------------------------- tools


def test_tool_choice_none(client):
    resp = client.chat.completions.create(
        model=MODEL,
        messages=WEATHER_Q,
        tools=TOOLS,
        tool_choice="none",
        temperature=0,
        max_tokens=12,
    )
    choice = resp.choices[0]
    assert choice.message.tool_calls is None
    assert isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length")


def test_tool_choice_auto(client):
    resp = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "system", "content": "You are a function-calling assistant."}, *WEATHER_Q],
        tools=TOOLS,
        tool_choice="auto",
        temperature=0,
        max_tokens=96,
    )
    choice = resp.choices[0]
    if choice.message.tool_calls:  # the model chose to call: calls must be complete and valid
        check_tool_calls(choice.message)
        assert choice.finish_reason == "tool_calls"
    else:  # the model chose to answer: plain text that never opens a call
        assert "<tool_call>" not in (choice.message.content or "")
        assert choice.finish_reason in ("stop", "length")


def test_tool_choice_required(client):
    resp = client.chat.completions.create(
        model=MODEL,
        messages=WEATHER_Q,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0,
        max_tokens=64,
    )
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert len(check_tool_calls(choice.message)) == 1
    assert not choice.message.content


def test_tool_choice_named(client):
    resp = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "What is 12 times 7?"}],
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "calculator"}},
        temperature=0,
        max_tokens=64,
    )
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = check_tool_calls(choice.message, allowed={"calculator"})
    assert len(calls) == 1 and calls[0][0] == "calculator"


@pytest.mark.parametrize("parallel", [True, False])
def test_parallel_tool_calls(client, parallel):
    resp = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Weather in Paris and in Rome, please."}],
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=parallel,
        temperature=0,
        max_tokens=96,
    )
    choice = resp.choices[0]
    calls = check_tool_calls(choice.message)
    if parallel:
        # one or more calls; if the model keeps adding calls until the budget, strict closing still
        # ends every call (finish_reason "length"), so each one parsed above
        assert len(calls) >= 1
        assert choice.finish_reason in ("tool_calls", "length")
    else:
        assert len(calls) == 1
        assert choice.finish_reason == "tool_calls"


def test_streamed_tool_call_deltas(client):
    kwargs = dict(
        model=MODEL,
        messages=WEATHER_Q,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0,
        max_tokens=64,
    )
    whole = client.chat.completions.create(**kwargs)
    calls: dict[int, dict[str, Any]] = {}
    finish = []
    for chunk in client.chat.completions.create(**kwargs, stream=True):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        if chunk.choices[0].finish_reason:
            finish.append(chunk.choices[0].finish_reason)
        assert not delta.content  # required: no free text
        for d in delta.tool_calls or []:
            if d.index not in calls:  # the opening delta: id, type and name
                assert d.id and d.id.startswith("call_") and d.type == "function" and d.function.name
                calls[d.index] = {"id": d.id, "name": d.function.name, "arguments": d.function.arguments or ""}
            else:  # then argument pieces only
                assert d.id is None and (d.function.name is None)
                calls[d.index]["arguments"] += d.function.arguments or ""
    assert finish == ["tool_calls"]
    assert list(calls) == [0]
    call = calls[0]
    args = json.loads(call["arguments"])
    jsonschema.validate(args, TOOL_PARAMS[call["name"]])
    ref = whole.choices[0].message.tool_calls[0]
    assert (call["name"], call["arguments"]) == (ref.function.name, ref.function.arguments)


def test_tool_result_round_trip(client):
    """An assistant tool call and its role=tool result are accepted back into the conversation."""
    msgs = [
        {"role": "user", "content": "What's the weather in Rome?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_abc",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Rome", "unit": "celsius"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_abc", "content": '{"temperature": 21, "sky": "clear"}'},
    ]
    resp = client.chat.completions.create(
        model=MODEL, messages=msgs, tools=TOOLS, tool_choice="none", temperature=0, max_tokens=12
    )
    assert isinstance(resp.choices[0].message.content, str)
    assert resp.choices[0].message.tool_calls is None


# --------------------------------------------------------------------------- structured output


class City(BaseModel):
    city: str
    country: str
    population_millions: float


def test_json_schema_parse_with_pydantic(client):
    resp = client.chat.completions.parse(
        model=MODEL,
        messages=[{"role": "user", "content": "Paris is the capital of France, about 2.1 million people."}],
        response_format=City,
        temperature=0,
        max_tokens=64,
    )
    choice = resp.choices[0]
    assert choice.finish_reason == "stop"
    assert isinstance(choice.message.parsed, City)
    assert json.loads(choice.message.content) == choice.message.parsed.model_dump()


def test_json_object(client):
    resp = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Give a JSON object with a key 'color'."}],
        response_format={"type": "json_object"},
        temperature=0,
        max_tokens=48,
    )
    choice = resp.choices[0]
    assert choice.finish_reason == "stop"
    assert isinstance(json.loads(choice.message.content), dict)


def test_regex_extension(client):
    pattern = r"\d{4}-\d{2}-\d{2}"
    resp = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "When did the Apollo 11 landing happen?"}],
        extra_body={"regex": pattern},
        temperature=0,
        max_tokens=16,
    )
    assert re.fullmatch(pattern, resp.choices[0].message.content)
    assert resp.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("schema_file", ["loop_prone_string_array.json", "loop_prone_nested_arrays.json"])
def test_loop_prone_schema_at_tight_budget_still_parses(http, schema_file):
    schema = json.loads((CORPUS / schema_file).read_text())
    body = chat_body(
        messages=[{"role": "user", "content": "List as many items as you possibly can, hundreds of them."}],
        response_format={"type": "json_schema", "json_schema": {"name": "loopy", "strict": True, "schema": schema}},
    )
    # the server says how few tokens the smallest valid output needs; give it a little more than that
    err = assert_openai_error(
        http.post("/v1/chat/completions", json={**body, "max_tokens": 1}), 400, param="max_tokens"
    )
    need = int(re.search(r"needs (\d+) tokens", err["message"]).group(1))
    resp = http.post("/v1/chat/completions", json={**body, "max_tokens": need + 12})
    assert resp.status_code == 200, resp.text
    choice = resp.json()["choices"][0]
    assert choice["finish_reason"] in ("stop", "length")
    jsonschema.validate(json.loads(choice["message"]["content"]), schema)
