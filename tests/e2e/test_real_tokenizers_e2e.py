"""Tool calls and reasoning with real tokenizers and real chat templates, end to end: tiny
random-weight models whose tokenizers are Qwen3's, DeepSeek's, gpt-oss's and Mistral's (Tekken) own
(registry packages and vendored ranks, see real_tokenizer_models.py) and whose templates are the
families' originals, served by a real `jumpgate serve` and driven by the official openai client.
The formats are detected from the template (qwen_3 with `<think>`; deepseek_r1 calls with its
template's opened `<think>`; harmony with its analysis channel; mistral), every marker is one token,
calls (auto, required, named, single, streamed) parse and validate, the think block is sent apart
and strict JSON after it is valid inside max_tokens, and a second request with the same tools finds
its prefix cached. gpt-oss's and Mistral's markers are special tokens: the engine keeps their text
for the parsers (GenerateRequest.keep_special_ids), and the answers show none of them.

Mistral runs only with JUMPGATE_TOOL_FORMATS_E2E=all (as the per-format e2e's other formats): its
131k-token Tekken vocabulary makes its server slow to start for CI's budget.
"""

from __future__ import annotations

import json
import os

import jsonschema
import pytest

from tests.e2e.real_tokenizer_models import tiny_deepseek_llama, tiny_harmony_llama, tiny_mistral, tiny_qwen3

openai = pytest.importorskip("openai")

# four families' servers (a minute of starts): the second tier, `make test-slow`
pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ADD = {
    "type": "object",
    "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["a"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "Oslo", "Lima"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
SCHEMAS = {"add": ADD, "get_weather": WEATHER}
TOOLS = [
    {"type": "function", "function": {"name": n, "description": f"{n} tool", "parameters": s, "strict": True}}
    for n, s in SCHEMAS.items()
]
SYSTEM = (
    "You are the weather desk of a travel agency. Answer each traveller's question about the weather with "
    "the tools given: look the forecast up for the city they name, for as many days as their stay lasts, "
    "and add up the numbers they ask about. Never guess a forecast; always call a tool first."
)
MESSAGES = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Weather in Paris for 3 days?"}]
# family -> (model builder, tool-call format, reasoning format, markers that must be one token each)
FAMILIES = {
    "harmony": (
        tiny_harmony_llama,
        "harmony",
        "harmony",
        ["<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|call|>", "<|return|>", "<|constrain|>"],
    ),
    "qwen3": (tiny_qwen3, "qwen_3", "qwen_3", ["<tool_call>", "</tool_call>", "<think>", "</think>", "<|im_end|>"]),
    "deepseek": (
        tiny_deepseek_llama,
        "deepseek_r1",
        "deepseek_r1",
        ["<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>", "</think>"],
    ),
}
# JUMPGATE_TOOL_FORMATS_E2E=all: Mistral's Tekken too (minutes; not CI's)
if os.environ.get("JUMPGATE_TOOL_FORMATS_E2E") == "all":
    FAMILIES["mistral"] = (
        tiny_mistral,
        "mistral",
        "none",
        ["[TOOL_CALLS]", "[ARGS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[INST]", "[/INST]", "</s>"],
    )
MAX_TOKENS = 96
# markers no answer may show (the parsers strip them)
MARKERS = (
    "<think>",
    "</think>",
    "<|channel|>",
    "<|message|>",
    "<|end|>",
    "<|start|>",
    "<|call|>",
    "[TOOL_CALLS]",
    "[ARGS]",
)
BLOCK_MARKERS = ("<think>", "</think>", "<|channel|>analysis<|message|>", "<|end|>")


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def served(request, tmp_path_factory):
    from transformers import AutoTokenizer

    from bench.harness.server_process import JumpgateServer

    build, tool_format, reasoning_format, markers = FAMILIES[request.param]
    model_dir = build(tmp_path_factory.mktemp(f"real-{request.param}"))
    srv = JumpgateServer(
        tmp_path_factory.mktemp(f"serve-{request.param}"),
        kv_pool_tokens=8192,
        extra_args=["--model", str(model_dir)],
        startup_timeout_s=600,
    )
    srv.start()
    try:
        client = openai.OpenAI(base_url=srv.base_url, api_key="none", max_retries=0)
        tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        yield request.param, client, client.models.list().data[0].id, tokenizer
    finally:
        srv.stop()


def no_markers(content: str | None, reasoning: str | None = None) -> None:
    """The answer shows no format marker, the reasoning not its block's own markers (inside the
    block random weights may write a marker token as text: the block's grammar takes any text)."""
    assert not any(m in (content or "") for m in MARKERS), content
    assert not any(m in (reasoning or "") for m in BLOCK_MARKERS), reasoning


def calls_of(choice) -> list[tuple[str, dict]]:
    assert choice.finish_reason == "tool_calls", (choice.finish_reason, choice.message)
    no_markers(choice.message.content, (choice.message.model_extra or {}).get("reasoning_content"))
    out = []
    for call in choice.message.tool_calls:
        args = json.loads(call.function.arguments)
        jsonschema.validate(args, SCHEMAS[call.function.name])
        out.append((call.function.name, args))
    assert out
    return out


def test_the_formats_come_from_the_real_template_and_markers_are_single_tokens(served):
    family, client, _, tokenizer = served
    _, tool_format, reasoning_format, markers = FAMILIES[family]
    formats = client.models.list().data[0].model_extra["jumpgate"]
    assert (formats["tool_call_format"], formats["reasoning_format"]) == (tool_format, reasoning_format)
    for marker in markers:
        assert len(tokenizer.encode(marker, add_special_tokens=False)) == 1, marker


def test_calls_parse_and_validate_in_every_mode(served):
    family, client, model, _ = served
    body = {"model": model, "messages": MESSAGES, "tools": TOOLS, "max_tokens": MAX_TOKENS, "temperature": 1.0}
    required = client.chat.completions.create(**body, tool_choice="required", n=4, seed=1)
    named = client.chat.completions.create(
        **body, tool_choice={"type": "function", "function": {"name": "add"}}, n=4, seed=2
    )
    single = client.chat.completions.create(**body, tool_choice="required", parallel_tool_calls=False, n=4, seed=3)
    auto = client.chat.completions.create(**body, tool_choice="auto", n=4, seed=4)
    for choice in required.choices:
        calls_of(choice)
    for choice in named.choices:
        assert [n for n, _ in calls_of(choice)] == ["add"]
    for choice in single.choices:
        assert len(calls_of(choice)) == 1
    for choice in auto.choices:
        if choice.message.tool_calls:
            calls_of(choice)
        else:
            assert choice.finish_reason == "stop", (choice.finish_reason, choice.message)
            no_markers(choice.message.content, (choice.message.model_extra or {}).get("reasoning_content"))


def test_a_streamed_call_equals_the_whole_one_and_reasoning_is_apart(served):
    family, client, model, _ = served
    body = {
        "model": model,
        "messages": MESSAGES,
        "tools": TOOLS,
        "tool_choice": "required",
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
    }
    whole = client.chat.completions.create(**body).choices[0]
    calls: dict[int, dict] = {}
    reasoning = ""
    for chunk in client.chat.completions.create(**body, stream=True):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
        for d in delta.tool_calls or []:
            call = calls.setdefault(d.index, {"name": "", "arguments": ""})
            call["name"] += d.function.name or ""
            call["arguments"] += d.function.arguments or ""
    assert [(c["name"], json.loads(c["arguments"])) for _, c in sorted(calls.items())] == calls_of(whole)
    assert reasoning == (whole.message.model_extra.get("reasoning_content") or "")
    no_markers(None, reasoning)


def test_strict_json_after_the_think_block_is_valid_within_max_tokens(served):
    family, client, model, _ = served
    if FAMILIES[family][2] == "none":
        pytest.skip(f"{family}'s template has no think block")
    fmt = {"type": "json_schema", "json_schema": {"name": "w", "strict": True, "schema": WEATHER}}
    thought = 0
    for max_tokens in (32, 64):
        resp = client.chat.completions.create(
            model=model, messages=MESSAGES, response_format=fmt, max_tokens=max_tokens, n=4, temperature=1.0, seed=5
        )
        for choice in resp.choices:
            assert choice.finish_reason == "stop", (max_tokens, choice.message)
            jsonschema.validate(json.loads(choice.message.content), WEATHER)
            thought += bool(choice.message.model_extra.get("reasoning_content"))
            no_markers(None, choice.message.model_extra.get("reasoning_content"))
        assert resp.usage.completion_tokens_details.reasoning_tokens > 0  # the blocks were counted
    assert thought > 0  # blocks were written and sent apart


def test_logprobs_show_each_marker_as_the_one_token_written(served):
    family, client, model, tokenizer = served
    markers = FAMILIES[family][3]
    choice = client.chat.completions.create(
        model=model,
        messages=MESSAGES,
        tools=TOOLS,
        tool_choice="required",
        max_tokens=MAX_TOKENS,
        temperature=0,
        logprobs=True,
    ).choices[0]
    calls_of(choice)
    tokens = [t.token for t in choice.logprobs.content]
    written = [t for t in tokens if t in markers]
    assert written, tokens  # the call's markers, each one token with its own record
    assert all(len(tokenizer.encode(t, add_special_tokens=False)) == 1 for t in written)


def test_the_same_tools_again_come_from_the_cache(served):
    _, client, model, _ = served
    body = {"model": model, "tools": TOOLS, "tool_choice": "required", "max_tokens": MAX_TOKENS, "temperature": 0}
    client.chat.completions.create(messages=[MESSAGES[0], {"role": "user", "content": "Oslo please"}], **body)
    again = client.chat.completions.create(messages=[MESSAGES[0], {"role": "user", "content": "Lima now"}], **body)
    usage = again.usage
    assert usage.prompt_tokens_details.cached_tokens >= 0.9 * usage.prompt_tokens
