"""How one model family writes tool calls: the markers, the tools prompt, past calls and results.

The default is the Hermes/Qwen style, written compact so the grammar forces long spans
(jump-forward) and leaves no whitespace to loop on:

    <tool_call>{"name":"get_weather","arguments":{"city":"Paris"}}</tool_call>

Several calls are separated by one newline. It is the format of a model without one of its own
(SmolLM2). A model family with its own convention uses the format xgrammar describes for it
(`get_model_structural_tag`, tag_format.py: llama, qwen_3, qwen_3_coder, harmony, kimi, ...), plus
`mistral`, written here in the same form; `get_tool_call_format` knows both.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

from grammar.errors import GrammarSpecError
from grammar.schema.canonical import canonical_json, canonical_tool


@dataclass(frozen=True)
class ToolCallFormat:
    """How tool calls are written by one model family (Hermes/Qwen style by default)."""

    name: str = "hermes"
    call_begin: str = "<tool_call>"
    call_end: str = "</tool_call>"
    call_separator: str = "\n"
    response_begin: str = "<tool_response>"
    response_end: str = "</tool_response>"

    def render_tools_prompt(self, tools: list[dict]) -> str:
        """Text appended after the system prompt. Canonical JSON (sorted keys, fixed separators),
        so the same tools always give the same tokens and share a KV-cache prefix."""
        lines = "\n".join(canonical_json(canonical_tool(t)) for t in tools)
        example = f'{self.call_begin}{{"name":<function-name>,"arguments":<arguments-json-object>}}{self.call_end}'
        return (
            "# Tools\n\n"
            "You may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n"
            f"<tools>\n{lines}\n</tools>\n\n"
            f"To call a function, write a JSON object with the function name and arguments within "
            f"{self.call_begin}{self.call_end} tags, exactly like this:\n"
            f"{example}"
        )

    def render_call(self, name: str, arguments: str) -> str:
        """One call as the model writes it (also used to render past assistant turns);
        `arguments` is the arguments' JSON text, inserted as is."""
        return f"{self.call_prefix(name)}{arguments}{self.call_suffix}"

    def render_calls(self, calls: Iterable[tuple[str, str]]) -> str:
        return self.call_separator.join(self.render_call(n, a) for n, a in calls)

    def render_tool_response(self, content: str) -> str:
        """A tool result as shown back to the model."""
        return f"{self.response_begin}\n{content}\n{self.response_end}"

    def call_prefix(self, name: str) -> str:
        """Everything before the arguments object: forced once the name is chosen."""
        return f'{self.call_begin}{{"name":{json.dumps(name, ensure_ascii=False)},"arguments":'

    @property
    def call_suffix(self) -> str:
        return "}" + self.call_end

    @property
    def value_checked(self) -> bool:
        return True  # the calls are JSON


HERMES_TOOL_CALL_FORMAT = ToolCallFormat()
TOOL_CALL_FORMATS: dict[str, ToolCallFormat] = {HERMES_TOOL_CALL_FORMAT.name: HERMES_TOOL_CALL_FORMAT}


def tool_call_format_names() -> list[str]:
    """Every format name: Jumpgate's hermes, then xgrammar's model formats and mistral."""
    from grammar.kinds.tool_calls.tag_format import tag_format_names

    return [*TOOL_CALL_FORMATS, *tag_format_names()]


def get_tool_call_format(name: str):
    """The format named `name`: a ToolCallFormat (hermes) or a TagToolCallFormat."""
    found = TOOL_CALL_FORMATS.get(name)
    if found is not None:
        return found
    from grammar.kinds.tool_calls.tag_format import get_tag_format

    tag = get_tag_format(name) if isinstance(name, str) else None
    if tag is None:
        raise GrammarSpecError(f"unknown tool-call format {name!r}; known: {', '.join(tool_call_format_names())}")
    return tag


def render_tools_prompt(tools: list[dict], fmt: ToolCallFormat = HERMES_TOOL_CALL_FORMAT) -> str:
    return fmt.render_tools_prompt(tools)
