"""The served model's tool-call and reasoning formats, fixed at start-up.

Read from its chat template and special tokens (grammar's detection rules), unless
`--tool-call-format` / `--reasoning-format` say otherwise; `--chat-template FILE` gives a model
that ships no template one (or replaces its own) before anything reads it. The result is shown in
`GET /v1/models` (the entry's `jumpgate` object) and in the start-up banner.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.pipeline import grammar_adapter


@dataclass(frozen=True)
class ModelFormats:
    tool_call: str
    reasoning: str
    detected: bool  # False: a flag chose at least one of them
    marker_ids: frozenset[int] = frozenset()  # special tokens kept as text in parsed outputs


def load_chat_template(tokenizer: Any, path: str) -> None:
    """`--chat-template FILE`: the template the tokenizer renders chats with from now on."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"--chat-template {path}: cannot read it ({getattr(e, 'strerror', None) or e})") from e
    if not text.strip():
        raise ValueError(f"--chat-template {path}: the file is empty")
    tokenizer.chat_template = text


def special_tokens(tokenizer: Any) -> list[str]:
    tokens = list(getattr(tokenizer, "all_special_tokens", None) or [])
    added = getattr(tokenizer, "get_added_vocab", None)
    if callable(added):
        try:
            tokens += list(added())
        except Exception:  # a tokenizer without an added vocabulary
            pass
    return tokens


def configure_formats(
    tokenizer: Any,
    tool_call_format: str | None = None,
    reasoning_format: str | None = None,
    chat_template: str | None = None,
    stop_token_ids: Any = (),
) -> ModelFormats:
    """Load `chat_template`, detect, apply the overrides, and set them for the gateway
    (ValueError naming the flag on a bad value), with the special tokens the formats write
    (`stop_token_ids`, the model's, are not among them)."""
    if chat_template:
        load_chat_template(tokenizer, chat_template)
    template = getattr(tokenizer, "chat_template", None)
    if not isinstance(template, (str, type(None))):  # a dict of named templates
        template = "\n".join(str(v) for v in dict(template).values())
    found_tools, found_reasoning = grammar_adapter.detect_formats(template, special_tokens(tokenizer))
    tool_call, reasoning = tool_call_format or found_tools, reasoning_format or found_reasoning
    grammar_adapter.use_formats(tool_call, reasoning)
    markers = grammar_adapter.use_markers(tokenizer, stop_token_ids)
    return ModelFormats(tool_call, reasoning, tool_call_format is None and reasoning_format is None, markers)
