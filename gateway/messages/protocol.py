"""The Anthropic Messages wire format as msgspec Structs (requests and responses).

Content blocks, tools, `system`, `thinking` and `tool_choice` arrive as plain JSON and are decoded
block by block in `gateway.messages.translate`, so that an unsupported block type is refused by
name at its own path. Unknown fields are ignored; the sampling extensions Jumpgate's chat API
takes (penalties, logit_bias, min_tokens, ...) are accepted as extra body fields, as vLLM does.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from msgspec import Meta, Struct

from gateway.protocol import JumpForward, MinP, NonNegInt, Penalty, RepetitionPenalty, SchemaMode

StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]


# --------------------------------------------------------------------------- request


class CacheControl(Struct):
    type: Literal["ephemeral"] = "ephemeral"
    ttl: Literal["5m", "1h"] | None = None


class TextBlock(Struct, tag="text", tag_field="type"):
    text: str
    cache_control: CacheControl | None = None
    citations: Any = None


class ToolUseBlock(Struct, tag="tool_use", tag_field="type"):
    id: str
    name: str
    input: dict[str, Any]
    cache_control: CacheControl | None = None


class ToolResultBlock(Struct, tag="tool_result", tag_field="type"):
    tool_use_id: str
    content: str | list[TextBlock] | None = None
    is_error: bool = False
    cache_control: CacheControl | None = None


class ThinkingBlock(Struct, tag="thinking", tag_field="type"):
    """Echoed back from an earlier turn; dropped from the prompt (chat templates drop past think blocks too)."""

    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(Struct, tag="redacted_thinking", tag_field="type"):
    data: str


InputBlock = Union[TextBlock, ToolUseBlock, ToolResultBlock, ThinkingBlock, RedactedThinkingBlock]
BLOCK_TYPES: dict[str, type] = {
    "text": TextBlock,
    "tool_use": ToolUseBlock,
    "tool_result": ToolResultBlock,
    "thinking": ThinkingBlock,
    "redacted_thinking": RedactedThinkingBlock,
}


class InputMessage(Struct):
    role: Literal["user", "assistant"]
    content: str | list[dict[str, Any]]  # blocks, decoded one by one (translate.decode_block)


class CustomTool(Struct, kw_only=True):
    name: str
    input_schema: dict[str, Any]
    description: str | None = None
    strict: bool | None = None
    type: Literal["custom"] | None = None
    cache_control: CacheControl | None = None


class ToolChoiceAuto(Struct, tag="auto", tag_field="type"):
    disable_parallel_tool_use: bool = False


class ToolChoiceAny(Struct, tag="any", tag_field="type"):
    disable_parallel_tool_use: bool = False


class ToolChoiceTool(Struct, tag="tool", tag_field="type"):
    name: str
    disable_parallel_tool_use: bool = False


class ToolChoiceNone(Struct, tag="none", tag_field="type"):
    pass


ToolChoice = Union[ToolChoiceAuto, ToolChoiceAny, ToolChoiceTool, ToolChoiceNone]


class JsonOutputFormat(Struct):
    type: Literal["json_schema"]
    schema: dict[str, Any]


class OutputConfig(Struct):
    format: JsonOutputFormat | None = None
    effort: str | None = None


class ThinkingConfig(Struct):
    type: str
    budget_tokens: int | None = None
    display: str | None = None


class Metadata(Struct):
    user_id: str | None = None


class CountTokensRequest(Struct, kw_only=True):
    """What `count_tokens` reads: everything that shapes the prompt."""

    model: str
    messages: list[InputMessage]
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None
    output_config: OutputConfig | None = None
    cache_control: CacheControl | None = None


class MessagesRequest(CountTokensRequest, kw_only=True):
    max_tokens: Annotated[int, Meta(ge=1)]
    stop_sequences: list[str] | None = None
    stream: bool = False
    metadata: Metadata | None = None
    # no longer sent by the current `anthropic` SDK; older clients do
    temperature: Annotated[float, Meta(ge=0, le=1)] | None = None
    top_p: Annotated[float, Meta(gt=0, le=1)] | None = None
    top_k: Annotated[int, Meta(ge=1)] | None = None
    # extra body fields: Jumpgate's (and vLLM's) sampling extensions
    seed: int | None = None
    min_p: MinP | None = None
    frequency_penalty: Penalty | None = None
    presence_penalty: Penalty | None = None
    repetition_penalty: RepetitionPenalty | None = None
    logit_bias: dict[str, float] | None = None
    min_tokens: NonNegInt | None = None
    stop_token_ids: list[NonNegInt] | None = None
    ignore_eos: bool = False
    jump_forward: JumpForward | None = None
    cache_salt: str | None = None
    schema_mode: SchemaMode | None = None


# --------------------------------------------------------------------------- response


class TextOut(Struct, tag="text", tag_field="type"):
    text: str


class ToolUseOut(Struct, tag="tool_use", tag_field="type"):
    id: str
    name: str
    input: dict[str, Any]


class ThinkingOut(Struct, tag="thinking", tag_field="type"):
    """A reasoning model's think block. `signature` is empty: nothing checks it when it comes back."""

    thinking: str
    signature: str = ""


ContentBlock = Union[ThinkingOut, TextOut, ToolUseOut]


class Usage(Struct, omit_defaults=False):
    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0


class Message(Struct):
    id: str
    model: str
    content: list[ContentBlock]
    usage: Usage
    stop_reason: StopReason | None = None
    stop_sequence: str | None = None
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"


class TokenCount(Struct):
    input_tokens: int


class ErrorDetail(Struct):
    type: str
    message: str


class ErrorBody(Struct):
    error: ErrorDetail
    type: Literal["error"] = "error"
