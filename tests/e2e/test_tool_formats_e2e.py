"""Model tool-call formats end to end: a tiny random-weight Llama (SmolLM2's vocabulary) given a
family's chat template with `--chat-template`, served by a real `jumpgate serve`, driven by the
official openai client. The grammar forces each format's structure, so random weights still write
well-formed calls: auto, required (parallel allowed), named and single calls, whole and streamed,
parse and validate, none ends cut, strict JSON after a think block is valid, and a second request
with the same tools finds its tools prefix cached.

One server per format (about 15 s to start), so two formats run by default: llama (JSON
arguments, detected from the template) and qwen_3_coder (XML arguments, chosen by
--tool-call-format); the others are unit-tested in tests/grammar/test_tool_formats.py.
`JUMPGATE_TOOL_FORMATS_E2E=all` runs every format with a template in tests/data/templates,
`JUMPGATE_TOOL_FORMATS_ROUNDS=R` (default 1) repeats the request mix R times over other user turns
(8 requests a round, plus 2 for the cache and one a round of strict JSON where the template has a
think block), and `JUMPGATE_TOOL_FORMATS_TALLY=FILE` appends one JSON line of counts per format.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import jsonschema
import pytest

openai = pytest.importorskip("openai")

TEMPLATES = Path(__file__).parents[1] / "data" / "templates"
PARAMS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "Oslo", "Lima"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
ADD = {
    "type": "object",
    "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["a"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Weather of a city", "parameters": PARAMS, "strict": True},
    },
    {"type": "function", "function": {"name": "add", "parameters": ADD, "strict": True}},
]
SCHEMAS = {"get_weather": PARAMS, "add": ADD}
SYSTEM = (
    "You are the weather desk of a travel agency. Answer each traveller's question about the weather with "
    "the tools below: look the forecast up for the city they name, for as many days as their stay lasts, "
    "and add up the numbers they ask about. Never guess a forecast; always call a tool first."
)
MESSAGES = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Weather in Paris?"}]
USER_TURNS = [
    "Weather in Paris?",
    "I am in Oslo for three days: what will it be like?",
    "Lima, next week. And add 2 and 5 for me.",
    "Check Paris for two days, then Oslo for one.",
    "What is 40 plus 2?",
    "Is it raining in Lima?",
]
# (xgrammar format, template file, whether --tool-call-format names it: else detected)
FORMATS = [("llama", "llama3_json.jinja", False), ("qwen_3_coder", "qwen3_coder.jinja", True)]
# JUMPGATE_TOOL_FORMATS_E2E=all: every format with a template in tests/data/templates (minutes; not CI's)
MORE_FORMATS = [
    ("qwen_3", "qwen3.jinja", False),
    ("harmony", "harmony.jinja", False),
    ("deepseek_v3_1", "deepseek_v3_1.jinja", False),
    ("kimi", "kimi_k2.jinja", False),
    ("glm_4_7", "glm_4_7.jinja", False),
    ("gemma_4", "gemma4.jinja", False),
    ("mistral", "mistral.jinja", False),
]
if os.environ.get("JUMPGATE_TOOL_FORMATS_E2E") == "all":
    FORMATS += MORE_FORMATS
ROUNDS = int(os.environ.get("JUMPGATE_TOOL_FORMATS_ROUNDS", "1"))
TALLY = os.environ.get("JUMPGATE_TOOL_FORMATS_TALLY")
# formats whose markers SmolLM2's vocabulary spells in many tokens need more room for one call
# (harmony: its analysis channel's markers too)
MAX_TOKENS = {"deepseek_v3_1": 128, "kimi": 128, "harmony": 128}
REASONING = {"qwen_3": "qwen_3", "harmony": "harmony", "deepseek_v3_1": "deepseek_r1"}  # what the template shows
N = 4  # choices per whole request
ANSWER = {
    "type": "object",
    "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo", "Lima"]}, "ok": {"type": "boolean"}},
    "required": ["city", "ok"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module", params=FORMATS, ids=[f[0] for f in FORMATS])
def served(request, tmp_path_factory, tiny_model_dir):
    from bench.harness.server_process import JumpgateServer

    name, template, explicit = request.param
    args = ["--model", str(tiny_model_dir), "--chat-template", str(TEMPLATES / template)]
    if explicit:
        args += ["--tool-call-format", name]
    srv = JumpgateServer(tmp_path_factory.mktemp(f"formats-{name}"), kv_pool_tokens=8192, extra_args=args)
    srv.start()
    tally = {"format": name, "rounds": ROUNDS, "requests": 0, "answers": 0, "calls": 0, "valid_calls": 0}
    try:
        client = openai.OpenAI(base_url=srv.base_url, api_key="none", max_retries=0)
        yield name, srv, client, client.models.list().data[0].id, tally
    finally:
        srv.stop()
        if TALLY:
            with open(TALLY, "a", encoding="utf-8") as f:
                f.write(json.dumps(tally) + "\n")


def count(tally: dict, key: str, by: int = 1) -> None:
    tally[key] = tally.get(key, 0) + by


def checked_calls(choice, tally: dict | None = None) -> list[tuple[str, dict]]:
    """Every call of a choice, parsed and validated against its tool's parameters."""
    if tally is not None:
        count(tally, "answers")
        count(tally, f"finish_{choice.finish_reason}")
    assert choice.finish_reason == "tool_calls", (choice.finish_reason, choice.message)
    calls = choice.message.tool_calls
    assert calls
    out = []
    for call in calls:
        if tally is not None:
            count(tally, "calls")
        args = json.loads(call.function.arguments)
        jsonschema.validate(args, SCHEMAS[call.function.name])
        if tally is not None:
            count(tally, "valid_calls")
        out.append((call.function.name, args))
    return out


def messages(round_: int) -> list[dict]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER_TURNS[round_ % len(USER_TURNS)]}]


def test_the_models_entry_names_its_formats(served):
    name, srv, client, _, _ = served
    entry = client.models.list().data[0]
    formats = entry.model_extra["jumpgate"]
    assert formats["tool_call_format"] == name
    assert formats["reasoning_format"] == REASONING.get(name, "none")
    assert srv.log_path.read_text().count(f"tool calls {name}") == 1  # the start-up banner


def test_auto_required_named_and_single_calls_parse_and_validate(served):
    name, _, client, model, tally = served
    for r in range(ROUNDS):
        body = {
            "model": model,
            "messages": messages(r),
            "tools": TOOLS,
            "max_tokens": MAX_TOKENS.get(name, 64),
            "n": N,
            "temperature": 1.0,
        }
        required = client.chat.completions.create(**body, tool_choice="required", seed=10 * r + 1)  # parallel
        named = client.chat.completions.create(
            **body, tool_choice={"type": "function", "function": {"name": "add"}}, seed=10 * r + 2
        )
        single = client.chat.completions.create(
            **body, tool_choice="required", parallel_tool_calls=False, seed=10 * r + 3
        )
        auto = client.chat.completions.create(**body, tool_choice="auto", seed=10 * r + 4)
        count(tally, "requests", 4)
        for choice in required.choices:
            count(tally, "parallel_answers", len(checked_calls(choice, tally)) > 1)
        for choice in named.choices:
            assert [n for n, _ in checked_calls(choice, tally)] == ["add"]
        for choice in single.choices:
            assert len(checked_calls(choice, tally)) == 1
        for choice in auto.choices:  # a call, or an answer in words that ended by itself
            if choice.message.tool_calls:
                checked_calls(choice, tally)
            else:
                count(tally, "answers")
                count(tally, f"auto_text_finish_{choice.finish_reason}")
                assert choice.finish_reason == "stop", (choice.finish_reason, choice.message)


def streamed_calls(client, body) -> tuple[str, list[tuple[str, dict]], str]:
    calls: dict[int, dict] = {}
    finish = None
    content = ""
    for chunk in client.chat.completions.create(**body, stream=True):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for d in delta.tool_calls or []:
            call = calls.setdefault(d.index, {"name": "", "arguments": ""})
            call["name"] += d.function.name or ""
            call["arguments"] += d.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    return finish, [(c["name"], json.loads(c["arguments"])) for _, c in sorted(calls.items())], content


def test_a_streamed_answer_equals_the_whole_one(served):
    name, _, client, model, tally = served
    for r in range(ROUNDS):
        for choice in ("required", "auto"):
            body = {
                "model": model,
                "messages": messages(r),
                "tools": TOOLS,
                "tool_choice": choice,
                "max_tokens": MAX_TOKENS.get(name, 64),
                "temperature": 0,
            }
            whole = client.chat.completions.create(**body).choices[0]
            finish, calls, content = streamed_calls(client, body)
            count(tally, "requests", 2)
            count(tally, "streamed")
            assert finish == whole.finish_reason
            if whole.message.tool_calls or choice == "required":
                assert calls == checked_calls(whole, tally)
                count(tally, "streamed_calls", len(calls))
            else:
                count(tally, "answers")
                assert (finish, calls, content) == ("stop", [], whole.message.content or "")


def test_strict_json_after_the_think_block_is_valid(served):
    name, _, client, model, tally = served
    if name not in REASONING:
        pytest.skip("the template shows no think block")
    for r in range(ROUNDS):
        answer = client.chat.completions.create(
            model=model,
            messages=messages(r),
            response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": ANSWER, "strict": True}},
            max_tokens=MAX_TOKENS.get(name, 64),
            n=2,
            temperature=1.0,
            seed=r,
        )
        count(tally, "requests")
        for choice in answer.choices:
            count(tally, "json_answers")
            assert choice.finish_reason == "stop", (choice.finish_reason, choice.message)
            jsonschema.validate(json.loads(choice.message.content), ANSWER)
            count(tally, "json_valid")
            reasoning = choice.message.model_extra.get("reasoning_content")
            count(tally, "json_after_reasoning", reasoning is not None)


def test_the_same_tools_again_come_from_the_cache(served):
    name, _, client, model, tally = served
    body = {
        "model": model,
        "tools": TOOLS,
        "tool_choice": "required",
        "max_tokens": MAX_TOKENS.get(name, 64),
        "temperature": 0,
    }
    client.chat.completions.create(messages=[MESSAGES[0], {"role": "user", "content": "Oslo please"}], **body)
    again = client.chat.completions.create(messages=[MESSAGES[0], {"role": "user", "content": "Lima now"}], **body)
    count(tally, "requests", 2)
    usage = again.usage
    tally["cached_share"] = round(usage.prompt_tokens_details.cached_tokens / usage.prompt_tokens, 3)
    assert usage.prompt_tokens_details.cached_tokens >= 0.9 * usage.prompt_tokens  # all but the user turn
