"""Chat messages → prompt text and token ids, in a fixed, cache-friendly order.

The first turn is always one system block built as: the request's leading system/developer text →
the tools text (grammar's tool-call format) → schema instructions (canonical JSON). Everything that
differs between calls of one agent (the conversation) comes after it, so the same system prompt +
the same tools render to the same leading tokens and share a radix-cache prefix.

The tools text and schema instructions share a token budget (`--schema-prompt-budget`): beyond
it they are rendered compacted (gateway/pipeline/schema_compaction.py), deterministically, while the grammar
still enforces the whole schema; so a long schema or a big tool set is never a context-length error.

Assistant tool calls are rendered back in the tool-call format the model is asked to produce.
Tool results become `tool` turns where the chat template knows that role, otherwise user turns with
the result wrapped in the tool-result format (SmolLM2's template knows system/user/assistant).
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Protocol, Sequence

from gateway.errors import bad_request
from gateway.pipeline import grammar_adapter
from gateway.pipeline.schema_compaction import FULL, LEVEL_NAMES, LEVELS, compact_schema, compact_tools
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
TEXT_MEMO_ENTRIES = 64  # token counts / compactions remembered: an agent sends the same tools every turn
COMPACTABLE_KINDS = ("json_schema",)  # kinds whose instructions are a schema the ladder can shorten

Schema = tuple[str, Any]  # (kind, payload) of the output constraint, to render its instructions again


def schema_budget_tokens(budget: float, max_context: int) -> int:
    """`--schema-prompt-budget` in tokens: up to 1 it is a fraction of the context, above 1 a count."""
    return max(1, int(budget * max_context)) if budget <= 1 else int(budget)


def schema_instructions(kind: str, payload: Any) -> str | None:
    """Natural-language hint matching the grammar (the grammar enforces it; the hint helps a small
    model choose sensible values). Canonical JSON so that equal schemas give equal prefixes."""
    return grammar_adapter.prompt_instructions(kind, payload)  # each kind renders its own


class PreviousTurn(Protocol):
    """An earlier prompt and its generation (gateway.responses.store.StoredTurn)."""

    prompt_text: str
    prompt_ids: list[int]
    output_text: str
    output_ids: list[int]
    tokenizer: str  # fingerprint of the tokenizer whose ids these are ("": not recorded)


class BoundedMemo:
    """A small thread-safe LRU map: prompts render on several worker threads at once."""

    def __init__(self, max_entries: int = TEXT_MEMO_ENTRIES) -> None:
        self.max_entries = max_entries
        self._items: OrderedDict[Any, Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Any) -> Any:
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
            return value

    def put(self, key: Any, value: Any) -> None:
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.max_entries:
                self._items.popitem(last=False)


@dataclass
class RenderedPrompt:
    text: str
    token_ids: list[int]
    system_text: str | None  # the system block as rendered (None: the template's default)
    schema_text_level: str = "full"  # how compacted the tools/schema text is (schema_compaction levels)


class PromptRenderer:
    def __init__(self, tokenizer: Any, schema_budget_tokens: int | None = None):
        self.tokenizer = tokenizer
        self.schema_budget_tokens = schema_budget_tokens  # None: the full text, however long
        self._token_counts = BoundedMemo()  # text -> tokens
        self._compacted = BoundedMemo()  # (full tools text, full instructions) -> what schema_texts returns
        template = getattr(tokenizer, "chat_template", None) or ""
        if not isinstance(template, str):  # some tokenizers keep a dict of named templates
            template = json.dumps(template)
        self.has_tool_role = "'tool'" in template or '"tool"' in template
        # the model's own tool format and a template that takes `tools=`: tools, past calls and
        # results go through the template (the model's own prompt); else Jumpgate's tools text
        self.template_takes_tools = "tools" in template
        self.template_takes_calls = "tool_calls" in template

    def native_tools(self) -> bool:
        """Whether tools go through the chat template (`tools=`) rather than Jumpgate's text."""
        return self.template_takes_tools and not grammar_adapter.uses_own_tools_text()

    def template_tools(self, tools: Sequence[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        """The `tools=` handed to the chat template: canonical JSON, so equal tools give equal tokens."""
        return grammar_adapter.canonical_tools(list(tools)) if tools and self.native_tools() else None

    def apply_template(
        self, turns: list[dict[str, Any]], tools: Sequence[dict[str, Any]] | None = None, **kwargs: Any
    ) -> str:
        """The chat template over `turns` (with `tools=` where the template takes them)."""
        template_tools = self.template_tools(tools)
        if template_tools is not None:
            kwargs["tools"] = template_tools
        return self.tokenizer.apply_chat_template(turns, tokenize=False, **kwargs)

    # ----------------------------------------------------------------- chat

    def schema_texts(
        self,
        tools: Sequence[dict[str, Any]] | None,
        instructions: str | None,
        schema: Schema | None = None,
    ) -> tuple[str | None, str | None, int]:
        """(tools text, instructions, level): the first compaction level whose text fits the budget
        (the last level when none does: the context check then decides)."""
        tools_text = grammar_adapter.render_tools_prompt(list(tools)) if tools else None
        if self.schema_budget_tokens is None or self._fits(tools_text, instructions):
            return tools_text, instructions, FULL
        # the full texts determine the result (canonical JSON): an agent's next turn is a lookup
        key = (tools_text, instructions)
        chosen = self._compacted.get(key)
        if chosen is None:
            chosen = self._compact(tools, instructions, schema)
            self._compacted.put(key, chosen)
        return chosen

    def _compact(
        self,
        tools: Sequence[dict[str, Any]] | None,
        instructions: str | None,
        schema: Schema | None,
    ) -> tuple[str | None, str | None, int]:
        kind, payload = schema if schema is not None else (None, None)
        compactable = kind in COMPACTABLE_KINDS
        if not tools and not compactable:  # nothing the ladder can shorten (a regex, an EBNF grammar)
            return None, instructions, FULL
        tools_text, instructions_text, level = None, instructions, FULL
        for level in LEVELS[1:]:
            tools_text = grammar_adapter.render_tools_prompt(compact_tools(list(tools), level)) if tools else None
            if compactable:
                instructions_text = schema_instructions(kind, compact_schema(payload, level))
            if self._fits(tools_text, instructions_text):
                break
        return tools_text, instructions_text, level

    def _fits(self, *texts: str | None) -> bool:
        assert self.schema_budget_tokens is not None
        return sum(self._token_count(t) for t in texts if t) <= self.schema_budget_tokens

    def _token_count(self, text: str) -> int:
        count = self._token_counts.get(text)
        if count is None:
            count = len(self.encode(text))
            self._token_counts.put(text, count)
        return count

    def system_block(
        self,
        system_text: str | None,
        tools: Sequence[dict[str, Any]] | None,
        instructions: str | None,
        schema: Schema | None = None,
    ) -> tuple[str | None, int]:
        """The system block and the compaction level of its tools/schema text."""
        tools_text, instructions_text, level = self.schema_texts(tools, instructions, schema)
        block = "\n\n".join(p for p in (system_text, tools_text, instructions_text) if p)
        return block or None, level

    def chat_turns(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]] | None = None,
        instructions: str | None = None,
        schema: Schema | None = None,
    ) -> tuple[list[dict[str, Any]], str | None, int]:
        """The role/content turns handed to the chat template, the system block, and the
        compaction level of its tools/schema text. With the model's own tool format and a template
        that takes tools, the tools are not in the system block (`apply_template` hands them over),
        past calls are `tool_calls` and results `tool` turns where the template knows them."""
        if not messages:
            raise bad_request("'messages' must contain at least one message.", "messages")
        leading: list[str] = []
        i = 0
        while i < len(messages) and isinstance(messages[i], (SystemMessage, DeveloperMessage)):
            leading.append(content_text(messages[i].content))
            i += 1
        native = bool(tools) and self.native_tools()
        system, level = self.system_block(
            "\n\n".join(leading) if leading else None, None if native else tools, instructions, schema
        )
        turns: list[dict[str, Any]] = []
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
                if native and self.has_tool_role:
                    turns.append(
                        {
                            "role": "tool",
                            "content": text,
                            "tool_call_id": msg.tool_call_id,
                            "name": call_names.get(msg.tool_call_id),
                        }
                    )
                elif self.has_tool_role:
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
                if msg.tool_calls and native and self.template_takes_calls:
                    for call in msg.tool_calls:
                        call_names[call.id] = call.function.name
                    turns.append(
                        {
                            "role": "assistant",
                            "content": text,
                            "tool_calls": [
                                {
                                    "id": c.id,
                                    "type": "function",
                                    "function": {
                                        "name": c.function.name,
                                        "arguments": _arguments(c.function.arguments),
                                    },
                                }
                                for c in msg.tool_calls
                            ],
                        }
                    )
                    continue
                if msg.tool_calls:
                    calls = []
                    for call in msg.tool_calls:
                        call_names[call.id] = call.function.name
                        calls.append((call.id, call.function.name, call.function.arguments))
                    text = text + grammar_adapter.render_tool_calls(calls)
                turns.append({"role": "assistant", "content": text})
        flush_results()
        return turns, system, level

    def render_chat(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]] | None = None,
        instructions: str | None = None,
        schema: Schema | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> RenderedPrompt:
        """`schema` (kind, payload) lets a schema's instructions be compacted to the budget;
        `template_kwargs` are extra variables of the chat template (`chat_template_kwargs`)."""
        turns, system, level = self.chat_turns(messages, tools, instructions, schema)
        try:
            text = self.apply_template(turns, tools, add_generation_prompt=True, **(template_kwargs or {}))
        except Exception as exc:  # jinja raises for role orders a template refuses
            raise bad_request(f"The chat template rejected the messages: {exc}", "messages") from exc
        return RenderedPrompt(
            text=text, token_ids=self.encode(text), system_text=system, schema_text_level=LEVEL_NAMES[level]
        )

    def render_continuation(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]] | None,
        instructions: str | None,
        previous: PreviousTurn,
        schema: tuple[str, Any] | None = None,
    ) -> RenderedPrompt:
        """`render_chat`, except that when the conversation extends `previous` (an earlier prompt
        and what the model generated after it) the new ids start with exactly its prompt ids and
        generated ids, which the radix cache holds; only the text after them is tokenized anew.
        Re-tokenizing the whole text could split the earlier output differently and lose the hit."""
        full = self.render_chat(messages, tools, instructions, schema)
        if previous.tokenizer != self.tokenizer_fingerprint:
            return full  # another model's ids (the store is shared), or unrecorded: only the text is ours
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
        ids = head_ids + self.encode(full.text[len(head_text) :])
        return RenderedPrompt(
            text=full.text, token_ids=ids, system_text=full.system_text, schema_text_level=full.schema_text_level
        )

    @property
    def tokenizer_fingerprint(self) -> str:
        """What a stored turn's ids are tagged with (computed once per tokenizer)."""
        return grammar_adapter.tokenizer_fingerprint(self.tokenizer)

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


def _arguments(arguments: str) -> Any:
    """A past call's arguments as the template takes them: the object (key order kept), or the
    text as given when it is not JSON."""
    try:
        return json.loads(arguments)
    except (TypeError, ValueError):
        return arguments
