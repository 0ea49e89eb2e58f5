"""Reasoning end to end: a tiny random-weight Qwen3 whose tokenizer (SmolLM2's) has Qwen3's think
markers as added tokens, served with Qwen3's chat template by a real `jumpgate serve`, driven by
the official openai client. The think block is sent apart from the answer (`reasoning_content`,
whole and streamed), strict JSON after the block is valid and never ends `length`,
`enable_thinking: false` and `reasoning_effort: "none"` leave no block, the thinking budget closes
the block in time, and usage counts the block's tokens.
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import torch

openai = pytest.importorskip("openai")

TEMPLATES = Path(__file__).parents[1] / "data" / "templates"
SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "Oslo", "Lima"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "note": {"type": "string", "maxLength": 20},
    },
    "required": ["city", "days", "note"],
    "additionalProperties": False,
}
FORMAT = {"type": "json_schema", "json_schema": {"name": "trip", "strict": True, "schema": SCHEMA}}
MESSAGES = [{"role": "user", "content": "Plan a short trip: which city, how many days? Think first."}]
N = 4


def make_tiny_qwen3(out: Path, smollm_dir: Path) -> Path:
    """A 2-layer random Qwen3 with SmolLM2's vocabulary plus `<think>` and `</think>` (added, not
    special, as in Qwen3's tokenizer)."""
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    tok = AutoTokenizer.from_pretrained(str(smollm_dir))
    tok.add_tokens(["<think>", "</think>"])
    tok.save_pretrained(str(out))
    torch.manual_seed(0)
    cfg = Qwen3Config(
        vocab_size=(len(tok) + 63) // 64 * 64,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=2048,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
    )
    model = Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    model.save_pretrained(str(out), safe_serialization=True)
    return out


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, smollm_dir):
    return make_tiny_qwen3(tmp_path_factory.mktemp("tiny-qwen3-think"), smollm_dir)


def serve(tmp_path_factory, model_dir, template: str, *flags: str):
    from bench.harness.server_process import JumpgateServer

    args = ["--model", str(model_dir), "--chat-template", str(TEMPLATES / template), *flags]
    # (a first start may build the CPU kernels: minutes on a loaded 2-core host)
    srv = JumpgateServer(
        tmp_path_factory.mktemp("reasoning"), kv_pool_tokens=8192, extra_args=args, startup_timeout_s=600
    )
    srv.start()
    try:
        client = openai.OpenAI(base_url=srv.base_url, api_key="none", max_retries=0)
        yield srv, client, client.models.list().data[0].id
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def served(tmp_path_factory, model_dir):
    """Qwen3's template: the model opens the block itself (reasoning format detected)."""
    yield from serve(tmp_path_factory, model_dir, "qwen3.jinja")


@pytest.fixture(scope="module")
def opened(tmp_path_factory, model_dir):
    """A template whose generation prompt opens the block, with DeepSeek-R1's markers by flag."""
    yield from serve(tmp_path_factory, model_dir, "qwen3_thinking.jinja", "--reasoning-format", "deepseek_r1")


def test_the_models_entry_names_the_reasoning_format(served):
    _, client, _ = served
    assert client.models.list().data[0].model_extra["jumpgate"]["reasoning_format"] == "qwen_3"


def test_strict_json_after_the_think_block_is_valid_within_max_tokens(served):
    _, client, model = served
    resp = client.chat.completions.create(
        model=model, messages=MESSAGES, response_format=FORMAT, max_tokens=96, n=N, temperature=1.0, seed=7
    )
    for choice in resp.choices:
        assert choice.finish_reason == "stop"
        message = choice.message
        assert message.model_extra["reasoning_content"]  # the block, apart from the answer
        assert "<think>" not in message.content and "</think>" not in message.content
        jsonschema.validate(json.loads(message.content), SCHEMA)
    details = resp.usage.completion_tokens_details
    assert 0 < details.reasoning_tokens < resp.usage.completion_tokens


@pytest.mark.parametrize("max_tokens", [32, 64])
def test_twenty_strict_answers_after_a_block_are_all_valid(served, max_tokens):
    """The issue's target: strict json_schema after reasoning valid within max_tokens, none `length`."""
    _, client, model = served
    choices = []
    for seed in range(4):
        resp = client.chat.completions.create(
            model=model,
            messages=MESSAGES,
            response_format=FORMAT,
            max_tokens=max_tokens,
            n=5,
            temperature=1.0,
            seed=100 * seed,
            extra_body={"thinking_budget": max_tokens},  # more than fits: closing must end the block
        )
        choices += resp.choices
        assert resp.usage.completion_tokens <= 5 * max_tokens
    assert len(choices) == 20
    for choice in choices:
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content), SCHEMA)


def test_a_tight_max_tokens_still_completes_the_answer(served):
    """Budget-aware closing counts the block's way out and the answer's shortest completion."""
    _, client, model = served
    resp = client.chat.completions.create(
        model=model,
        messages=MESSAGES,
        response_format=FORMAT,
        max_tokens=40,
        extra_body={"thinking_budget": 1000},
        n=N,
        temperature=1.0,
        seed=3,
    )
    for choice in resp.choices:
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content), SCHEMA)


def test_the_thinking_budget_closes_the_block(served):
    _, client, model = served
    resp = client.chat.completions.create(
        model=model, messages=MESSAGES, response_format=FORMAT, max_tokens=200, extra_body={"thinking_budget": 10}
    )
    assert resp.usage.completion_tokens_details.reasoning_tokens <= 10 + 2  # the way out's tokens
    jsonschema.validate(json.loads(resp.choices[0].message.content), SCHEMA)


def test_a_streamed_answer_equals_the_whole_one(served):
    _, client, model = served
    body = {"model": model, "messages": MESSAGES, "response_format": FORMAT, "max_tokens": 80, "temperature": 0}
    whole = client.chat.completions.create(**body).choices[0].message
    reasoning, content, finish = "", "", None
    usage = None
    for chunk in client.chat.completions.create(**body, stream=True, stream_options={"include_usage": True}):
        if chunk.usage is not None:
            usage = chunk.usage
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
        content += delta.content or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "stop"
    assert (reasoning, content) == (whole.model_extra["reasoning_content"], whole.content)
    assert usage.completion_tokens_details.reasoning_tokens > 0


@pytest.mark.parametrize(
    "extra",
    [{"chat_template_kwargs": {"enable_thinking": False}}, {"reasoning_effort": "none"}],
    ids=["kwargs", "effort"],
)
def test_thinking_off_leaves_no_block(served, extra):
    _, client, model = served
    resp = client.chat.completions.create(
        model=model, messages=MESSAGES, response_format=FORMAT, max_tokens=40, extra_body=extra
    )
    message = resp.choices[0].message
    assert "reasoning_content" not in (message.model_extra or {})
    jsonschema.validate(json.loads(message.content), SCHEMA)
    assert resp.usage.completion_tokens_details is None


def test_free_text_with_an_effort_gets_a_bounded_block(served):
    _, client, model = served
    resp = client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=64, reasoning_effort="low", temperature=1.0, seed=1
    )
    # low: a quarter of max_tokens; random weights write no end marker, so the budget ends the block
    assert resp.usage.completion_tokens_details.reasoning_tokens <= 16 + 2
    assert resp.choices[0].message.model_extra["reasoning_content"] is not None


TOOLS = [
    {
        "type": "function",
        "function": {"name": "plan_trip", "parameters": SCHEMA, "strict": True},
    },
    {
        "type": "function",
        "function": {
            "name": "add",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99}},
                "required": ["a"],
                "additionalProperties": False,
            },
            "strict": True,
        },
    },
]


def test_tool_calls_follow_the_block_whole_and_streamed(served):
    _, client, model = served
    body = {"model": model, "messages": MESSAGES, "tools": TOOLS, "max_tokens": 96, "temperature": 0}
    whole = client.chat.completions.create(**body, tool_choice="required")
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.model_extra["reasoning_content"]
    calls = [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls]
    for name, args in calls:
        jsonschema.validate(args, next(t["function"]["parameters"] for t in TOOLS if t["function"]["name"] == name))

    reasoning, streamed, finish = "", {}, None
    for chunk in client.chat.completions.create(**body, tool_choice="required", stream=True):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
        for d in delta.tool_calls or []:
            call = streamed.setdefault(d.index, {"name": "", "arguments": ""})
            call["name"] += d.function.name or ""
            call["arguments"] += d.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls"
    assert reasoning == choice.message.model_extra["reasoning_content"]
    assert [(c["name"], json.loads(c["arguments"])) for _, c in sorted(streamed.items())] == calls

    named = client.chat.completions.create(
        **body, tool_choice={"type": "function", "function": {"name": "add"}}, n=4, seed=5
    )
    for c in named.choices:
        assert c.finish_reason == "tool_calls" and [t.function.name for t in c.message.tool_calls] == ["add"]


# ---- /v1/responses ---------------------------------------------------------------------------------


def test_responses_give_a_reasoning_item_before_the_answer(served):
    _, client, model = served
    body = {
        "model": model,
        "input": MESSAGES[0]["content"],
        "text": {"format": {"type": "json_schema", "name": "trip", "schema": SCHEMA, "strict": True}},
        "max_output_tokens": 80,
        "reasoning": {"effort": "medium", "summary": "auto"},
        "temperature": 0,
    }
    whole = client.responses.create(**body)
    assert [item.type for item in whole.output] == ["reasoning", "message"]
    reasoning = whole.output[0].content[0].text
    assert reasoning and whole.usage.output_tokens_details.reasoning_tokens > 0
    jsonschema.validate(json.loads(whole.output_text), SCHEMA)

    deltas, texts, done = [], [], None
    for event in client.responses.create(**body, stream=True):
        if event.type == "response.reasoning_text.delta":
            deltas.append(event.delta)
        elif event.type == "response.output_text.delta":
            texts.append(event.delta)
        elif event.type == "response.completed":
            done = event.response
    assert "".join(deltas) == reasoning and "".join(texts) == whole.output_text
    assert [item.type for item in done.output] == ["reasoning", "message"]

    # a client that hands the reasoning item back in the next turn's input
    follow = client.responses.create(
        model=model,
        input=[
            {"role": "user", "content": "Trip?"},
            whole.output[0].model_dump(),
            {"role": "user", "content": "Again"},
        ],
        max_output_tokens=24,
        reasoning={"effort": "low"},
    )
    assert follow.status in ("completed", "incomplete")


def test_responses_refuse_a_summary_they_cannot_write(served):
    _, client, model = served
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model=model, input="hi", reasoning={"summary": "detailed"})
    assert err.value.body["param"] == "reasoning.summary"


# ---- /v1/messages (the anthropic client) -----------------------------------------------------------


@pytest.fixture(scope="module")
def claude(served):
    anthropic = pytest.importorskip("anthropic")
    srv, _, model = served
    return anthropic.Anthropic(base_url=srv.base_url.removesuffix("/v1"), api_key="none", max_retries=0), model


def test_messages_with_thinking_enabled_give_a_thinking_block(claude):
    client, model = claude
    body = {
        "model": model,
        "max_tokens": 96,
        "messages": MESSAGES,
        "thinking": {"type": "enabled", "budget_tokens": 24},
        "output_config": {"format": {"type": "json_schema", "schema": SCHEMA}},
        "extra_body": {"temperature": 0},  # (the current SDK sends no temperature itself)
    }
    whole = client.messages.create(**body)
    assert [b.type for b in whole.content] == ["thinking", "text"]
    assert whole.content[0].thinking and whole.content[0].signature == ""
    jsonschema.validate(json.loads(whole.content[1].text), SCHEMA)
    assert whole.stop_reason == "end_turn"

    with client.messages.stream(**body) as stream:
        events = list(stream)
        final = stream.get_final_message()
    kinds = [e.delta.type for e in events if e.type == "content_block_delta"]
    assert "thinking_delta" in kinds and "signature_delta" in kinds and "text_delta" in kinds
    assert [b.type for b in final.content] == ["thinking", "text"]
    assert final.content[0].thinking == whole.content[0].thinking
    assert final.content[1].text == whole.content[1].text


def test_messages_without_thinking_write_no_block(claude):
    client, model = claude
    reply = client.messages.create(
        model=model,
        max_tokens=40,
        messages=MESSAGES,
        output_config={"format": {"type": "json_schema", "schema": SCHEMA}},
    )
    assert [b.type for b in reply.content] == ["text"]
    jsonschema.validate(json.loads(reply.content[0].text), SCHEMA)


def test_messages_refuse_a_budget_not_below_max_tokens(claude):
    anthropic = pytest.importorskip("anthropic")
    client, model = claude
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.create(
            model=model, max_tokens=32, messages=MESSAGES, thinking={"type": "enabled", "budget_tokens": 32}
        )
    assert "budget_tokens" in str(err.value)


# ---- a prompt that opens the block (DeepSeek-R1's markers, chosen by flag) --------------------------


def test_an_opened_block_is_reasoning_from_the_first_token(opened):
    _, client, model = opened
    entry = client.models.list().data[0].model_extra["jumpgate"]
    assert entry["reasoning_format"] == "deepseek_r1" and entry["detected"] is False
    resp = client.chat.completions.create(
        model=model, messages=MESSAGES, response_format=FORMAT, max_tokens=48, n=N, temperature=1.0, seed=11
    )
    for choice in resp.choices:
        assert choice.finish_reason == "stop"
        assert choice.message.model_extra["reasoning_content"]
        jsonschema.validate(json.loads(choice.message.content), SCHEMA)  # no blank line: R1 writes none


def test_effort_none_closes_a_block_the_template_opened(opened):
    """This template has no enable_thinking: a budget of 0 closes the block at once."""
    _, client, model = opened
    resp = client.chat.completions.create(
        model=model, messages=MESSAGES, response_format=FORMAT, max_tokens=40, reasoning_effort="none"
    )
    message = resp.choices[0].message
    assert message.model_extra["reasoning_content"] is None  # an empty block
    assert resp.usage.completion_tokens_details.reasoning_tokens == 1  # `</think>` alone
    jsonschema.validate(json.loads(message.content), SCHEMA)


@pytest.mark.parametrize(
    ("extra", "param"),
    [({"reasoning_effort": "extreme"}, "reasoning_effort"), ({"thinking_budget": -1}, "thinking_budget")],
)
def test_bad_reasoning_fields_are_a_400_naming_them(served, extra, param):
    _, client, model = served
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=8, extra_body=extra)
    assert err.value.body["param"] == param
