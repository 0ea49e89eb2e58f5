"""Engine outcomes → Messages content blocks, `stop_reason` and `usage` (the whole-response form;
`gateway.messages.events` streams the same blocks).

Anthropic counts `input_tokens` without the tokens read from the cache: a prompt of N tokens of
which C came from the radix cache is `input_tokens` N - C, `cache_read_input_tokens` C.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from gateway.messages.protocol import ContentBlock, Message, StopReason, TextOut, ThinkingOut, ToolUseOut, Usage
from gateway.pipeline import grammar_adapter
from gateway.pipeline.generation import Outcome
from runtime.decode.detokenizer import IncrementalDetokenizer


def message_id() -> str:
    return f"msg_{uuid.uuid4().hex[:24]}"


def tool_use_id(call_id: str | None = None) -> str:
    """`toolu_...`: the parser's call id carried over where it has one (stable within a response)."""
    if call_id:
        tail = call_id.split("_", 1)[-1].replace("-", "")
        if tail:
            return f"toolu_{tail}"
    return f"toolu_{uuid.uuid4().hex[:24]}"


def tool_input(arguments: str) -> dict[str, Any]:
    """A call's arguments as the `input` object ({} when a budget cut them short of valid JSON)."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def matched_stop(tokenizer: Any, outcome: Outcome, stop_sequences: list[str] | None) -> str | None:
    """The stop sequence the generation ended on, if any: the engine emits text only up to a stop
    string, so the stop string is the one that starts where the emitted text ends."""
    if not stop_sequences or outcome.finish_reason != "stop" or not outcome.token_ids:
        return None
    # the text as the engine decoded it: special tokens left out, or a format's markers kept
    # (GenerateRequest.keep_special_ids) where the output was parsed
    for keep in (frozenset(), grammar_adapter.marker_ids()):
        decoded = IncrementalDetokenizer(tokenizer, keep=keep).decode(outcome.token_ids)
        if decoded.startswith(outcome.text):
            break
    else:
        return None
    tail = decoded[len(outcome.text) :]
    found = [(tail.find(s), -len(s), s) for s in stop_sequences if s and s in tail]
    return min(found)[2] if found else None


def stop_reason(outcome: Outcome, has_tool_use: bool, stop_sequence: str | None) -> StopReason:
    if outcome.finish_reason == "length":
        return "max_tokens"
    if has_tool_use:
        return "tool_use"
    return "stop_sequence" if stop_sequence is not None else "end_turn"


def usage_of(outcome: Outcome) -> Usage:
    cached = min(outcome.cached_tokens, outcome.prompt_tokens)
    return Usage(
        input_tokens=outcome.prompt_tokens - cached,
        output_tokens=outcome.completion_tokens,
        cache_read_input_tokens=cached,
    )


def content_blocks(
    text: str, parse_tool_calls: bool, answer_tool: str | None, thinking: str | None = None
) -> list[ContentBlock]:
    """The think block (where one was written), text before the calls, then one tool_use block
    per call; the final-answer tool's arguments (tools + output_config.format) are the text."""
    content, calls = grammar_adapter.parse_tool_calls(text) if parse_tool_calls else (text, [])
    answer = "".join(c.arguments for c in calls if c.name == answer_tool)
    blocks: list[ContentBlock] = []
    if thinking:
        blocks.append(ThinkingOut(thinking=thinking))
    if (content or "") + answer:
        blocks.append(TextOut(text=(content or "") + answer))
    for c in calls:
        if c.name != answer_tool:
            blocks.append(ToolUseOut(id=tool_use_id(c.id), name=c.name, input=tool_input(c.arguments)))
    return blocks


def message(
    msg_id: str,
    model: str,
    outcome: Outcome,
    parse_tool_calls: bool,
    answer_tool: str | None,
    stop_sequence: str | None,
) -> Message:
    blocks = content_blocks(outcome.text, parse_tool_calls, answer_tool, outcome.reasoning)
    has_tool_use = any(isinstance(b, ToolUseOut) for b in blocks)
    return Message(
        id=msg_id,
        model=model,
        content=blocks,
        usage=usage_of(outcome),
        stop_reason=stop_reason(outcome, has_tool_use, stop_sequence),
        stop_sequence=stop_sequence,
    )
