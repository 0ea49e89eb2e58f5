"""The tools/schema text in the prompt has a token budget: beyond it the text is compacted, never a
context-length error. Real SmolLM2 tokenizer; the HTTP tests run over the scripted fake engine."""

from __future__ import annotations

import json

import msgspec
import pytest

from gateway.pipeline.prompt import PromptRenderer, schema_budget_tokens, schema_instructions
from gateway.pipeline.schema_compaction import DESCRIPTION_CHARS, STRUCTURE, compact_schema
from gateway.protocol import Message

MODEL = "SmolLM2-135M-Instruct"
USER = [{"role": "user", "content": "Call the right tool."}]
CONTEXT = 8192


def many_tools(count: int = 128, params: int = 20) -> list[dict]:
    """OpenAI's limit of 128 tools, each with 20 described string parameters."""
    return [
        {
            "type": "function",
            "function": {
                "name": f"tool_{t}",
                "description": f"Tool number {t}: does one thing well for the user's request.",
                "parameters": {
                    "type": "object",
                    "required": [f"param_{p}" for p in range(params)],
                    "properties": {
                        f"param_{p}": {"type": "string", "description": f"Parameter {p} of tool {t}"}
                        for p in range(params)
                    },
                },
            },
        }
        for t in range(count)
    ]


def long_schema(min_bytes: int = 15_000) -> dict:
    """A realistic 15 KB object schema: many described fields, enums, a nested object."""
    properties: dict = {}
    i = 0
    while len(json.dumps(properties)) < min_bytes:
        properties[f"field_{i}"] = (
            {
                "type": "string",
                "description": f"Field {i}: " + "a human-readable explanation of this field " * 3,
                "enum": [f"value_{i}_{v}" for v in range(12)],
            }
            if i % 3 == 0
            else {
                "type": "object",
                "description": f"Nested block {i}",
                "properties": {"amount": {"type": "number"}, "note": {"type": "string", "description": "free text"}},
                "required": ["amount"],
            }
        )
        i += 1
    return {"type": "object", "properties": properties, "required": list(properties)[:5]}


def msgs(items: list[dict]) -> list:
    return msgspec.convert(items, list[Message])


def tokens(renderer: PromptRenderer, text: str | None) -> int:
    return len(renderer.encode(text)) if text else 0


# ------------------------------------------------------------------ the ladder, on the real tokenizer


def test_the_budget_is_a_fraction_of_the_context_or_a_token_count():
    assert schema_budget_tokens(0.5, CONTEXT) == 4096
    assert schema_budget_tokens(1, CONTEXT) == CONTEXT
    assert schema_budget_tokens(3000, CONTEXT) == 3000


def test_128_tools_with_20_parameters_fit_the_budget(tokenizer):
    renderer = PromptRenderer(tokenizer, schema_budget_tokens=4096)
    tools = many_tools()
    full_text, _, _ = PromptRenderer(tokenizer).schema_texts(tools, None)
    assert tokens(renderer, full_text) > CONTEXT  # the case that used to be a context-length error
    tools_text, _, level = renderer.schema_texts(tools, None)
    assert level > 0 and tokens(renderer, tools_text) <= 4096
    assert all(f'"tool_{t}"' in tools_text for t in range(128))  # every tool is still named
    out = renderer.render_chat(msgs(USER), tools=tools)
    assert out.schema_text_level != "full" and len(out.token_ids) < CONTEXT


def test_compaction_is_deterministic_and_key_order_free(tokenizer):
    renderer = PromptRenderer(tokenizer, schema_budget_tokens=4096)
    tools = many_tools()
    reordered = [json.loads(json.dumps(t, sort_keys=True)) for t in reversed(tools)][::-1]
    first = renderer.render_chat(msgs(USER), tools=tools)
    again = PromptRenderer(tokenizer, schema_budget_tokens=4096).render_chat(msgs(USER), tools=reordered)
    assert first.text == again.text and first.token_ids == again.token_ids


def test_a_repeated_tool_set_gets_the_same_compaction(tokenizer):
    renderer = PromptRenderer(tokenizer, schema_budget_tokens=4096)
    first = renderer.schema_texts(many_tools(), None)
    assert renderer.schema_texts(many_tools(), None) == first  # remembered, and identical


def test_a_regex_hint_is_never_rewritten(tokenizer):
    renderer = PromptRenderer(tokenizer, schema_budget_tokens=1)
    assert renderer.schema_texts(None, "Answer yes or no.", ("regex", "(yes|no)")) == (None, "Answer yes or no.", 0)


def test_text_within_the_budget_is_left_whole(tokenizer):
    tools = many_tools(count=2, params=3)
    budgeted = PromptRenderer(tokenizer, schema_budget_tokens=4096).render_chat(msgs(USER), tools=tools)
    unbounded = PromptRenderer(tokenizer).render_chat(msgs(USER), tools=tools)
    assert budgeted.text == unbounded.text and budgeted.schema_text_level == "full"


def test_the_first_level_that_fits_is_chosen(tokenizer):
    """Long descriptions alone over the budget: trimming them is enough, the types stay."""
    schema = {
        "type": "object",
        "required": ["city"],
        "properties": {
            "city": {"type": "string", "description": "The city. " + "Spell it the way its residents do. " * 40}
        },
    }
    unbounded = PromptRenderer(tokenizer)
    full = schema_instructions("json_schema", schema)
    budget = tokens(unbounded, full) - 50
    renderer = PromptRenderer(tokenizer, schema_budget_tokens=budget)
    _, text, level = renderer.schema_texts(None, full, ("json_schema", schema))
    assert level == 1 and tokens(renderer, text) <= budget
    assert '"type":"string"' in text and "The city." in text and "…" in text
    trimmed = json.loads(text.split("\n", 1)[1])["properties"]["city"]["description"]
    assert len(trimmed) <= DESCRIPTION_CHARS + 1


def test_structure_level_keeps_a_property_named_description():
    schema = {
        "type": "object",
        "description": "an item",
        "properties": {
            "description": {"type": "string", "description": "what it is"},
            "kind": {"enum": list(range(20))},
        },
    }
    out = compact_schema(schema, STRUCTURE)
    assert out == {
        "type": "object",
        "properties": {"description": {"type": "string"}, "kind": {"enum": list(range(8))}},
    }


def test_compaction_reaches_every_sub_schema_the_keyword_table_names():
    # one table (grammar/schema/keyword_sets.py) for every walker: draft-7 `dependencies` and
    # `additionalItems` hold schemas too (a name list under `dependencies` is left as it is)
    schema = {
        "type": "object",
        "dependencies": {"a": {"description": "dropped", "required": ["b"]}, "c": ["d"]},
        "items": [{"type": "string"}],
        "additionalItems": {"type": "integer", "title": "dropped"},
    }
    assert compact_schema(schema, STRUCTURE) == {
        "type": "object",
        "dependencies": {"a": {"required": ["b"]}, "c": ["d"]},
        "items": [{"type": "string"}],
        "additionalItems": {"type": "integer"},
    }


# ------------------------------------------------------------------ over HTTP (fake engine)


@pytest.fixture
def long_context(fake_engine):
    fake_engine.max_context = fake_engine.kv_pool_tokens = CONTEXT
    return fake_engine


def test_128_tools_request_is_answered(gateway_client, long_context):
    tools = many_tools()
    args = {f"param_{p}": "x" for p in range(20)}
    long_context.reply = lambda req: f'<tool_call>{{"name":"tool_7","arguments":{json.dumps(args)}}}</tool_call>'
    resp = gateway_client().post(
        "/v1/chat/completions", json={"model": MODEL, "messages": USER, "tools": tools, "max_tokens": 512}
    )
    assert resp.status_code == 200, resp.text
    call = resp.json()["choices"][0]["message"]["tool_calls"][0]
    assert call["function"]["name"] == "tool_7" and json.loads(call["function"]["arguments"]) == args
    assert len(long_context.submitted[0].prompt_ids) <= CONTEXT // 2 + 200


def test_a_15kb_schema_is_not_a_context_length_error(gateway_client, long_context, tokenizer):
    schema = long_schema()
    assert len(json.dumps(schema)) >= 15_000
    assert tokens(PromptRenderer(tokenizer), schema_instructions("json_schema", schema)) > 4096  # whole: no fit
    long_context.max_context = long_context.kv_pool_tokens = 4096  # the full text would not fit at all
    long_context.reply = lambda req: "{}"
    client = gateway_client()
    resp = client.post(
        "/v1/chat/completions",
        json={
            "model": MODEL,
            "messages": USER,
            "max_tokens": 16,
            "response_format": {"type": "json_schema", "json_schema": {"name": "big", "schema": schema}},
        },
    )
    assert "context_length_exceeded" not in resp.text
    assert resp.status_code == 200, resp.text
