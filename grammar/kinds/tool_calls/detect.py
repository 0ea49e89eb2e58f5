"""Which tool-call and reasoning format a model writes, read from its chat template and special
tokens at load. The first rule whose marker shows wins; a model with none gets Jumpgate's own
`hermes` format (its tools text goes in the system block, as for SmolLM2)."""

from __future__ import annotations

from collections.abc import Iterable

# (format, markers any of which shows it; "a&b": both), most specific first
TOOL_CALL_RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("harmony", ("<|channel|>",)),
    ("mistral", ("[TOOL_CALLS]",)),
    ("deepseek_r1", ("<｜tool▁sep｜>&```json",)),  # R1 wraps the arguments in a json code block
    ("deepseek_v3_1", ("<｜tool▁calls▁begin｜>",)),
    ("kimi", ("<|tool_calls_section_begin|>",)),
    ("glm_4_7", ("<arg_key>",)),
    ("gemma_4", ("<|tool_call>",)),
    ("qwen_3_coder", ("<function=",)),
    ("llama", ("<|python_tag|>", '"parameters": ')),
    ("qwen_3", ("<tool_call>",)),
)
REASONING_RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("harmony", ("<|channel|>",)),
    ("deepseek_r1", ("<｜Assistant｜>&</think>",)),
    ("qwen_3", ("<think>",)),
)
DEFAULT_TOOL_CALL_FORMAT = "hermes"
NO_REASONING = "none"


def _first(rules, text: str) -> str | None:
    for name, markers in rules:
        if any(all(part in text for part in m.split("&")) for m in markers):
            return name
    return None


def detect_tool_call_format(template: str | None, special_tokens: Iterable[str] = ()) -> str:
    """The tool-call format a chat template writes calls in (`hermes` if it shows none); a
    template that takes no `tools` at all gets `hermes` too, whatever its tokens."""
    text = template or ""
    if "tools" not in text and "tool_calls" not in text:
        return DEFAULT_TOOL_CALL_FORMAT
    found = _first(TOOL_CALL_RULES, text)
    if found is None:  # the markers may live only in the special tokens (the template loops over them)
        found = _first(TOOL_CALL_RULES, "\n".join(special_tokens))
    return found or DEFAULT_TOOL_CALL_FORMAT


def detect_reasoning_format(template: str | None, special_tokens: Iterable[str] = ()) -> str:
    """The reasoning format (`none`: the model writes no think block)."""
    return _first(REASONING_RULES, (template or "") + "\n" + "\n".join(special_tokens)) or NO_REASONING
