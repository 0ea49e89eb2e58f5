"""The model-format registry (grammar/kinds/tool_calls/tag_format.py): per format, xgrammar's
structural tag with Jumpgate's arguments grammar, the parser read from the same tag (whole and
streamed), detection from chat templates (tests/data/templates/), and the prompt through the
model's template with `tools=`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import xgrammar as xgr

from gateway.pipeline import grammar_adapter
from gateway.pipeline.model_formats import configure_formats
from gateway.pipeline.prompt import PromptRenderer
from gateway.protocol import AssistantMessage, FunctionCall, ToolCall, ToolMessage, UserMessage
from grammar.checks.rollback import RollbackVocab, TagCallRollbackRules
from grammar.checks.value_rules import value_check_begin, value_checked
from grammar.kinds.tool_calls.detect import detect_reasoning_format, detect_tool_call_format
from grammar.kinds.tool_calls.format import HERMES_TOOL_CALL_FORMAT, get_tool_call_format
from grammar.kinds.tool_calls.parser import parse_tool_calls, stream_parser
from grammar.kinds.tool_calls.tag_format import SUPPORTED_FORMATS

TEMPLATES = Path(__file__).parents[1] / "data" / "templates"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather of a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
                "required": ["city", "days"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "add",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}},
                "required": ["a"],
                "additionalProperties": False,
            },
        },
    },
]
WEATHER, ADD = ("get_weather", '{"city":"Paris","days":3}'), ("add", '{"a":1}')
# template file -> the format detected from it
TEMPLATE_FORMATS = {
    "llama3_json.jinja": "llama",
    "qwen3.jinja": "qwen_3",
    "qwen3_coder.jinja": "qwen_3_coder",
    "harmony.jinja": "harmony",
    "deepseek_v3_1.jinja": "deepseek_v3_1",
    "kimi_k2.jinja": "kimi",
    "glm_4_7.jinja": "glm_4_7",
    "gemma4.jinja": "gemma_4",
    "mistral.jinja": "mistral",
}
FORMATS = sorted(set(TEMPLATE_FORMATS.values()))


@pytest.fixture(scope="module")
def compiler(tokenizer):
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=len(tokenizer))
    return xgr.GrammarCompiler(info, max_threads=1), tokenizer.eos_token_id


@pytest.fixture(autouse=True)
def back_to_hermes(tokenizer):
    """The served format is process-wide: each test leaves SmolLM2's hermes behind it."""
    yield
    configure_formats(tokenizer)


def grammar_of(compiler, fmt, choice, parallel=True):
    return compiler[0].compile_structural_tag(fmt.structural_tag(TOOLS, choice, parallel)), compiler[1]


def grammar_accepts(grammar, text: str) -> bool:
    """The whole of `text` is a complete output of the grammar (it may end there)."""
    compiled, eos = grammar
    matcher = xgr.GrammarMatcher(compiled, terminate_without_stop_token=False)
    return matcher.accept_string(text) and matcher.accept_token(eos)


def calls_of(text: str, fmt) -> list[tuple[str, dict]]:
    _, calls = parse_tool_calls(text, fmt)
    return [(c.name, json.loads(c.arguments)) for c in calls]


@pytest.mark.parametrize("name", FORMATS)
def test_the_grammar_takes_each_tool_choice_as_the_format_writes_it(name, compiler):
    fmt = get_tool_call_format(name)
    both, one = fmt.render_calls([WEATHER, ADD]), fmt.render_calls([ADD])
    assert grammar_accepts(grammar_of(compiler, fmt, "required"), both)
    assert not grammar_accepts(grammar_of(compiler, fmt, "required", parallel=False), both)  # one call at most
    assert grammar_accepts(grammar_of(compiler, fmt, "required", parallel=False), one)
    assert grammar_accepts(grammar_of(compiler, fmt, {"type": "function", "function": {"name": "add"}}), one)
    assert not grammar_accepts(
        grammar_of(compiler, fmt, {"type": "function", "function": {"name": "add"}}), fmt.render_calls([ADD, ADD])
    )  # a named function: exactly one call
    assert not grammar_accepts(
        grammar_of(compiler, fmt, {"type": "function", "function": {"name": "add"}}), fmt.render_calls([WEATHER])
    )
    # the arguments are each tool's schema: a wrong type or a missing property is refused
    assert not grammar_accepts(grammar_of(compiler, fmt, "required"), fmt.render_calls([("add", '{"a":"x"}')]))
    assert not grammar_accepts(
        grammar_of(compiler, fmt, "required"), fmt.render_calls([("get_weather", '{"city":"Paris"}')])
    )
    if name != "harmony":  # harmony's auto answers in its final channel, never bare text
        assert grammar_accepts(grammar_of(compiler, fmt, "auto"), "Let me check. " + one)
        assert grammar_accepts(grammar_of(compiler, fmt, "auto"), "No call needed.")


@pytest.mark.parametrize("name", FORMATS)
def test_the_parser_reads_back_what_the_format_writes_whole_and_streamed(name):
    fmt = get_tool_call_format(name)
    prefix = "" if name == "harmony" else "Sure."
    text = prefix + fmt.render_calls([WEATHER, ADD])
    content, calls = parse_tool_calls(text, fmt)
    assert content == prefix
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris", "days": 3}),
        ("add", {"a": 1}),
    ]
    # streamed one character at a time: the deltas add up to the whole answer
    parser = stream_parser(fmt)
    deltas = [d for ch in text for d in parser.feed(ch)] + parser.finish()
    streamed_content = "".join(d.text for d in deltas if type(d).__name__ == "ContentDelta")
    args: dict[int, str] = {}
    for d in deltas:
        if type(d).__name__ == "ToolCallArgumentsDelta":
            args[d.index] = args.get(d.index, "") + d.arguments
    assert streamed_content == content
    assert [args[i] for i in sorted(args)] == [c.arguments for c in calls]


@pytest.mark.parametrize("template,name", sorted(TEMPLATE_FORMATS.items()))
def test_a_call_the_template_renders_parses_back(template, name, tokenizer):
    """The model's own template writes a past call; the format's parser reads it back: the format
    detected from the template is the one its calls are written in."""
    text = (TEMPLATES / template).read_text()
    assert detect_tool_call_format(text) == name
    rendered = tokenizer.apply_chat_template(
        [
            {"role": "user", "content": "USERTURN"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 3}},
                    }
                ],
            },
        ],
        tools=TOOLS,
        chat_template=text,
        tokenize=False,
    )
    call = rendered[rendered.rindex("USERTURN") + len("USERTURN") :]
    assert calls_of(call, get_tool_call_format(name))[0] == ("get_weather", {"city": "Paris", "days": 3})


def test_detection_falls_back_to_hermes_and_finds_reasoning(tokenizer):
    assert detect_tool_call_format(tokenizer.chat_template) == "hermes"  # SmolLM2: no tools in its template
    assert detect_tool_call_format(None) == "hermes"
    assert detect_reasoning_format((TEMPLATES / "qwen3.jinja").read_text()) == "qwen_3"
    assert detect_reasoning_format((TEMPLATES / "harmony.jinja").read_text()) == "harmony"
    assert detect_reasoning_format(tokenizer.chat_template) == "none"


def test_every_listed_format_builds_and_unknown_names_are_refused(compiler):
    for name in SUPPORTED_FORMATS:
        fmt = get_tool_call_format(name)
        assert fmt.shape.calls, name
        grammar_of(compiler, fmt, "required")
    with pytest.raises(ValueError, match="known: hermes, qwen_3"):
        grammar_adapter.use_formats("nope", "none")
    with pytest.raises(ValueError, match="--reasoning-format"):
        grammar_adapter.use_formats("llama", "nope")


def test_value_check_and_rollback_follow_json_arguments_only():
    assert value_check_begin("tool_calls", {"format": "hermes"}) == b"<tool_call>"
    assert value_check_begin("tool_calls", {"format": "llama"}) == b'", "parameters": '
    assert value_check_begin("tool_calls", {"format": "kimi"}) == b"<|tool_call_argument_begin|>"
    assert value_checked("tool_calls", {"format": "qwen_3"})
    assert not value_checked("tool_calls", {"format": "qwen_3_coder"})  # markup: the mask only

    fmt = get_tool_call_format("qwen_3")
    rules = TagCallRollbackRules(
        {"get_weather": TOOLS[0]["function"]["parameters"]}, fmt.header_re(), RollbackVocab([b"x"]), 2
    )
    good = fmt.render_calls([WEATHER]).encode()
    bad = fmt.render_calls([("get_weather", '{"city":"Paris","days":0}')]).encode()  # minimum 1
    assert rules.failures(good) == []
    ((start, end, path),) = rules.failures(bad)
    assert bad[start:end] == b"0" and path == (0, "days")


def test_hermes_stays_the_default_with_the_same_spec(tokenizer):
    formats = configure_formats(tokenizer)
    assert (formats.tool_call, formats.reasoning, formats.detected) == ("hermes", "none", True)
    assert grammar_adapter.FORMAT is HERMES_TOOL_CALL_FORMAT
    spec = grammar_adapter.make_spec("tool_calls", {"tools": TOOLS, "tool_choice": "auto", "parallel_tool_calls": True})
    assert spec.payload["format"] == "hermes"  # so compiled-grammar cache keys are unchanged


@pytest.fixture
def qwen3_tokenizer(tokenizer):
    """SmolLM2's tokenizer with the Qwen3-style template (through --chat-template) and its format."""
    from copy import deepcopy

    tok = deepcopy(tokenizer)
    configure_formats(tok, chat_template=str(TEMPLATES / "qwen3.jinja"))
    return tok


def test_tools_go_through_the_models_template_canonically(qwen3_tokenizer):
    assert grammar_adapter.tool_call_format_name() == "qwen_3"
    renderer = PromptRenderer(qwen3_tokenizer)
    reordered = [
        {
            "function": {
                "parameters": t["function"]["parameters"],
                "name": t["function"]["name"],
                **({"description": t["function"]["description"]} if "description" in t["function"] else {}),
            },
            "type": "function",
        }
        for t in TOOLS
    ]
    a = renderer.render_chat([UserMessage(content="weather?")], tools=TOOLS)
    b = renderer.render_chat([UserMessage(content="weather?")], tools=reordered)
    assert a.token_ids == b.token_ids  # canonical tool JSON: the same tools, the same tokens
    assert "<tools>" in a.text and "For each function call" in a.text  # the template's own tools text
    assert "exactly like this" not in a.text  # not Jumpgate's hermes text
    # past calls and results: the template writes them
    history = [
        UserMessage(content="weather?"),
        AssistantMessage(
            content=None,
            tool_calls=[
                ToolCall(id="c1", function=FunctionCall(name="get_weather", arguments='{"city":"Paris","days":3}'))
            ],
        ),
        ToolMessage(content="sunny", tool_call_id="c1"),
    ]
    out = renderer.render_chat(history, tools=TOOLS)
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>' in out.text
    assert "<tool_response>\nsunny\n</tool_response>" in out.text
    assert out.text.startswith(a.text[: a.text.index("<|im_start|>user")])  # the tools prefix is shared


def test_markup_arguments_are_typed_by_the_tools_schema():
    fmt = get_tool_call_format("qwen_3_coder")
    text = (
        "<tool_call>\n<function=get_weather>\n<parameter=city>\n42\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
        "</function>\n</tool_call>"
    )
    schemas = {"get_weather": TOOLS[0]["function"]["parameters"]}
    (call,) = parse_tool_calls(text, fmt, schemas=schemas)[1]
    assert json.loads(call.arguments) == {"city": "42", "days": 3}  # a string where the schema says so
    (untyped,) = parse_tool_calls(text, fmt)[1]
    assert json.loads(untyped.arguments) == {"city": 42, "days": 3}  # without the schema: read as JSON
    gemma = get_tool_call_format("gemma_4")
    (nested,) = parse_tool_calls('<|tool_call>call:f{a:{b:[1,<|"|>x, y<|"|>]},c:true}<tool_call|>', gemma)[1]
    assert json.loads(nested.arguments) == {"a": {"b": [1, "x, y"]}, "c": True}


def test_a_bad_chat_template_file_is_refused_naming_the_flag(tokenizer, tmp_path):
    from copy import deepcopy

    tok = deepcopy(tokenizer)
    with pytest.raises(ValueError, match="--chat-template .*missing.jinja: cannot read it"):
        configure_formats(tok, chat_template=str(tmp_path / "missing.jinja"))
    (tmp_path / "empty.jinja").write_text("  \n")
    with pytest.raises(ValueError, match="the file is empty"):
        configure_formats(tok, chat_template=str(tmp_path / "empty.jinja"))
    formats = configure_formats(tok, tool_call_format="llama")  # a flag wins over detection
    assert (formats.tool_call, formats.detected) == ("llama", False)


def test_text_that_only_looks_like_a_call_stays_content():
    fmt = get_tool_call_format("llama")
    text = 'The JSON {"name": "a b"} is not a call; ' + fmt.render_calls([ADD])
    content, calls = parse_tool_calls(text, fmt)
    assert content == 'The JSON {"name": "a b"} is not a call;'
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("add", {"a": 1})]
    parser = stream_parser(fmt)
    streamed = "".join(d.text for ch in text for d in parser.feed(ch) if type(d).__name__ == "ContentDelta")
    streamed += "".join(d.text for d in parser.finish() if type(d).__name__ == "ContentDelta")
    assert streamed == content


def test_harmony_reads_each_header_variant_and_required_needs_a_call(compiler):
    fmt = get_tool_call_format("harmony")
    variants = [
        ' to=functions.add<|channel|>commentary json<|message|>{"a":1}<|call|>',
        ' to=functions.add<|channel|>commentary <|constrain|>json<|message|>{"a":1}<|call|>',
        '<|channel|>commentary to=functions.add<|constrain|>json<|message|>{"a":1}<|call|>',
    ]
    for text in variants:
        assert calls_of(text, fmt) == [("add", {"a": 1})], text
        assert grammar_accepts(grammar_of(compiler, fmt, "required"), text)
    assert not grammar_accepts(grammar_of(compiler, fmt, "required"), "")
    assert not grammar_accepts(grammar_of(compiler, fmt, "required", parallel=False), "")
    assert not grammar_accepts(grammar_of(compiler, fmt, {"type": "function", "function": {"name": "add"}}), "")
    final = "<|channel|>final<|message|>It is sunny.<|return|>"
    assert parse_tool_calls(final, fmt) == ("It is sunny.", [])


def test_the_special_tokens_a_format_writes_are_the_markers_kept(tokenizer):
    """SmolLM2 has none (its output decodes as before); a tokenizer whose `[TOOL_CALLS]` and
    `[ARGS]` are special keeps those, not its other special tokens nor a stop token."""
    from copy import deepcopy

    from tokenizers import AddedToken

    assert configure_formats(tokenizer).marker_ids == frozenset() == grammar_adapter.marker_ids()
    tok = deepcopy(tokenizer)
    tok.add_tokens([AddedToken(t, special=True) for t in ("[TOOL_CALLS]", "[ARGS]", "[NOT_A_MARKER]")], True)
    tok.chat_template = (TEMPLATES / "mistral.jinja").read_text(encoding="utf-8")
    calls, args = tok.convert_tokens_to_ids("[TOOL_CALLS]"), tok.convert_tokens_to_ids("[ARGS]")
    formats = configure_formats(tok)
    assert formats.tool_call == "mistral" and formats.marker_ids == {calls, args} == grammar_adapter.marker_ids()
    assert configure_formats(tok, stop_token_ids=[args]).marker_ids == {calls}  # a stop token is never text


def test_the_markers_are_kept_only_where_the_output_is_parsed(fake_engine, gateway_client, monkeypatch):
    client = gateway_client()
    monkeypatch.setattr(grammar_adapter, "MARKER_IDS", frozenset({7}))
    body = {"model": fake_engine.info.model_name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    assert client.post("/v1/chat/completions", json={**body, "tools": TOOLS}).status_code == 200
    assert fake_engine.submitted[-1].keep_special_ids == {7}  # tool calls: the parser reads the markers
    assert client.post("/v1/chat/completions", json=body).status_code == 200
    assert fake_engine.submitted[-1].keep_special_ids == frozenset()  # free text: special tokens stay out
