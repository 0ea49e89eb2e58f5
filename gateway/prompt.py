"""Chat messages → prompt text and token ids, in a fixed, cache-friendly order.

The first turn is always one system block built as: the request's leading system/developer text →
the tools text (grammar's tool-call format) → schema instructions (canonical JSON). Everything that
differs between calls of one agent (the conversation) comes after it, so the same system prompt +
the same tools render to the same leading tokens and share a radix-cache prefix.

Assistant tool calls are rendered back in the tool-call format the model is asked to produce.
Tool results become `tool` turns where the chat template knows that role, otherwise user turns with
the result wrapped in the tool-result format (SmolLM2's template knows system/user/assistant).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Protocol, Sequence

from gateway import grammar_adapter
from gateway.errors import bad_request
from gateway.protocol import (
    AssistantMessage,
    DeveloperMessage,
    Message,
    SystemMessage,
    ToolMessage,
    UserMessage,
    content_text,
)

BOUNDARY_CONTEXT_CHARS = 40


def schema_instructions(kind: str, payload: Any) -> str | None:
    """Natural-language hint matching the grammar (the grammar enforces it; the hint helps a small
    model choose sensible values). Canonical JSON so that equal schemas give equal prefixes."""
    return grammar_adapter.prompt_instructions(kind, payload)  # each kind renders its own


class PreviousTurn(Protocol):
    """An earlier prompt and its generation (gateway.response_store.StoredTurn)."""

    prompt_text: str
    prompt_ids: list[int]
    output_text: str
    output_ids: list[int]


@dataclass
class RenderedPrompt:
    text: str
    token_ids: list[int]
    system_text: str | None  # the system block as rendered (None: the template's default)


class PromptRenderer:
    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        template = getattr(tokenizer, "chat_template", None) or ""
        if not isinstance(template, str):  # some tokenizers keep a dict of named templates
            template = json.dumps(template)
        self.has_tool_role = "'tool'" in template or '"tool"' in template

    # ----------------------------------------------------------------- chat

    def system_block(
        self, system_text: str | None, tools: Sequence[dict[str, Any]] | None, instructions: str | None
    ) -> str | None:
        parts = [system_text or ""]
        if tools:
            parts.append(grammar_adapter.render_tools_prompt(list(tools)))
        if instructions:
            parts.append(instructions)
        block = "\n\n".join(p for p in parts if p)
        return block or None

    def chat_turns(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]] | None = None,
        instructions: str | None = None,
    ) -> tuple[list[dict[str, str]], str | None]:
        """The role/content turns handed to the chat template, and the system block."""
        if not messages:
            raise bad_request("'messages' must contain at least one message.", "messages")
        leading: list[str] = []
        i = 0
        while i < len(messages) and isinstance(messages[i], (SystemMessage, DeveloperMessage)):
            leading.append(content_text(messages[i].content))
            i += 1
        system = self.system_block("\n\n".join(leading) if leading else None, tools, instructions)
        turns: list[dict[str, str]] = []
        if system is not None:
            turns.append({"role": "system", "content": system})

        call_names: dict[str, str] = {}
        pending_results: list[str] = []

        def flush_results() -> None:
            if pending_results:
                turns.append({"role": "user", "content": "\n".join(pending_results)})
                pending_results.clear()

        for index in range(i, len(messages)):
            msg = messages[index]
            if isinstance(msg, ToolMessage):
                text = content_text(msg.content)
                if self.has_tool_role:
                    turns.append({"role": "tool", "content": text})
                else:
                    name = call_names.get(msg.tool_call_id)
                    pending_results.append(grammar_adapter.render_tool_result(name, msg.tool_call_id, text))
                continue
            flush_results()
            if isinstance(msg, (SystemMessage, DeveloperMessage)):
                turns.append({"role": "system", "content": content_text(msg.content)})
            elif isinstance(msg, UserMessage):
                turns.append({"role": "user", "content": content_text(msg.content)})
            elif isinstance(msg, AssistantMessage):
                text = content_text(msg.content)
                if msg.tool_calls:
                    calls = []
                    for call in msg.tool_calls:
                        call_names[call.id] = call.function.name
                        calls.append((call.id, call.function.name, call.function.arguments))
                    text = text + grammar_adapter.render_tool_calls(calls)
                turns.append({"role": "assistant", "content": text})
        flush_results()
        return turns, system

    def render_chat(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]] | None = None,
        instructions: str | None = None,
    ) -> RenderedPrompt:
        turns, system = self.chat_turns(messages, tools, instructions)
        try:
            text = self.tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)
        except Exception as exc:  # jinja raises for role orders a template refuses
            raise bad_request(f"The chat template rejected the messages: {exc}", "messages") from exc
        return RenderedPrompt(text=text, token_ids=self.encode(text), system_text=system)

    def render_continuation(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]] | None,
        instructions: str | None,
        previous: "PreviousTurn",
    ) -> RenderedPrompt:
        """`render_chat`, except that when the conversation extends `previous` (an earlier prompt
        and what the model generated after it) the new ids start with exactly its prompt ids and
        generated ids, which the radix cache holds; only the text after them is tokenized anew.
        Re-tokenizing the whole text could split the earlier output differently and lose the hit."""
        full = self.render_chat(messages, tools, instructions)
        head_ids = list(previous.prompt_ids) + list(previous.output_ids)
        generated = self.decode(previous.output_ids)
        if generated != previous.output_text:  # a trailing stop token: its text follows the output
            stop_text = self.decode(previous.output_ids[-1:]) if previous.output_ids else ""
            if self.decode(previous.output_ids[:-1]) != previous.output_text:
                return full  # a stop string cut the text: the ids say more than the text
            generated = previous.output_text + stop_text
        head_text = previous.prompt_text + generated
        if not full.text.startswith(head_text):
            return full  # tools, instructions or the template changed the earlier turns
        ids = head_ids + self.encode(full.text[len(head_text):])
        return RenderedPrompt(text=full.text, token_ids=ids, system_text=full.system_text)

    # ----------------------------------------------------------------- plain text

    def encode(self, text: str) -> list[int]:
        # The template already wrote any BOS/special markers into the text.
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def encode_completion_prompt(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=True))

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=False)

    def boundary_context(self, token_ids: Sequence[int], index: int) -> tuple[str, str]:
        """~40 characters on both sides of token position `index`."""
        index = max(0, min(index, len(token_ids)))
        # a window of tokens is plenty for 40 characters (every token decodes to >= 1 character
        # except rare byte pieces) and keeps long prompts cheap
        window = 2 * BOUNDARY_CONTEXT_CHARS
        before = self.decode(token_ids[max(0, index - window) : index])[-BOUNDARY_CONTEXT_CHARS:]
        after = self.decode(token_ids[index : index + window])[:BOUNDARY_CONTEXT_CHARS]
        return before, after
