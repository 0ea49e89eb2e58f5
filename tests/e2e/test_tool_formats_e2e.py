"""Model tool-call formats end to end: a tiny random-weight Llama (SmolLM2's vocabulary) given a
family's chat template with `--chat-template`, served by a real `jumpgate serve`, driven by the
official openai client. The grammar forces each format's structure, so random weights still write
well-formed calls: required (parallel allowed), named, single and streamed calls parse and
validate, none ends cut, and a second request with the same tools finds its tools prefix cached.

One server per format (about 15 s to start), so two formats run here: llama (JSON arguments,
detected from the template) and qwen_3_coder (XML arguments, chosen by --tool-call-format); the
others are unit-tested in tests/grammar/test_tool_formats.py.
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
# formats whose markers SmolLM2's vocabulary spells in many tokens need more room for one call
MAX_TOKENS = {"deepseek_v3_1": 128, "kimi": 128, "harmony": 96}
REASONING = {"qwen_3": "qwen_3", "harmony": "harmony", "deepseek_v3_1": "deepseek_r1"}  # what the template shows
N = 4  # choices per request


@pytest.fixture(scope="module", params=FORMATS, ids=[f[0] for f in FORMATS])
def served(request, tmp_path_factory, tiny_model_dir):
    from bench.harness.server_process import JumpgateServer

    name, template, explicit = request.param
    args = ["--model", str(tiny_model_dir), "--chat-template", str(TEMPLATES / template)]
    if explicit:
        args += ["--tool-call-format", name]
    srv = JumpgateServer(tmp_path_factory.mktemp(f"formats-{name}"), kv_pool_tokens=8192, extra_args=args)
    srv.start()
    try:
        client = openai.OpenAI(base_url=srv.base_url, api_key="none", max_retries=0)
        yield name, srv, client, client.models.list().data[0].id
    finally:
        srv.stop()


def checked_calls(choice) -> list[tuple[str, dict]]:
    """Every call of a choice, parsed and validated against its tool's parameters."""
    assert choice.finish_reason == "tool_calls", (choice.finish_reason, choice.message)
    calls = choice.message.tool_calls
    assert calls
    out = []
    for call in calls:
        args = json.loads(call.function.arguments)
        jsonschema.validate(args, SCHEMAS[call.function.name])
        out.append((call.function.name, args))
    return out


def test_the_models_entry_names_its_formats(served):
    name, srv, client, _ = served
    entry = client.models.list().data[0]
    formats = entry.model_extra["jumpgate"]
    assert formats["tool_call_format"] == name
    assert formats["reasoning_format"] == REASONING.get(name, "none")
    assert srv.log_path.read_text().count(f"tool calls {name}") == 1  # the start-up banner


def test_required_named_and_single_calls_parse_and_validate(served, request):
    name, _, client, model = served
    if name == "kimi":  # known gap, only in the JUMPGATE_TOOL_FORMATS_E2E=all run
        request.applymarker(
            pytest.mark.xfail(
                reason="budget-aware closing: after <|tool_call_end|> the plan may "
                "open another call instead of the section end, so a choice "
                "can end 'length' with its arguments whole"
            )
        )
    body = {
        "model": model,
        "messages": MESSAGES,
        "tools": TOOLS,
        "max_tokens": MAX_TOKENS.get(name, 64),
        "n": N,
        "temperature": 1.0,
    }
    required = client.chat.completions.create(**body, tool_choice="required", seed=1)  # parallel calls allowed
    named = client.chat.completions.create(
        **body, tool_choice={"type": "function", "function": {"name": "add"}}, seed=2
    )
    single = client.chat.completions.create(**body, tool_choice="required", parallel_tool_calls=False, seed=3)
    for choice in required.choices:
        checked_calls(choice)
    for choice in named.choices:
        assert [n for n, _ in checked_calls(choice)] == ["add"]
    for choice in single.choices:
        assert len(checked_calls(choice)) == 1


def test_a_streamed_answer_equals_the_whole_one(served):
    name, _, client, model = served
    body = {
        "model": model,
        "messages": MESSAGES,
        "tools": TOOLS,
        "tool_choice": "required",
        "max_tokens": MAX_TOKENS.get(name, 64),
        "temperature": 0,
    }
    whole = checked_calls(client.chat.completions.create(**body).choices[0])
    calls: dict[int, dict] = {}
    finish = None
    for chunk in client.chat.completions.create(**body, stream=True):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        for d in delta.tool_calls or []:
            call = calls.setdefault(d.index, {"name": "", "arguments": ""})
            call["name"] += d.function.name or ""
            call["arguments"] += d.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls"
    assert [(c["name"], json.loads(c["arguments"])) for _, c in sorted(calls.items())] == whole


def test_the_same_tools_again_come_from_the_cache(served):
    name, _, client, model = served
    body = {
        "model": model,
        "tools": TOOLS,
        "tool_choice": "required",
        "max_tokens": MAX_TOKENS.get(name, 64),
        "temperature": 0,
    }
    client.chat.completions.create(messages=[MESSAGES[0], {"role": "user", "content": "Oslo please"}], **body)
    again = client.chat.completions.create(messages=[MESSAGES[0], {"role": "user", "content": "Lima now"}], **body)
    usage = again.usage
    assert usage.prompt_tokens_details.cached_tokens >= 0.9 * usage.prompt_tokens  # all but the user turn
