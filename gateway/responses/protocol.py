"""The OpenAI Responses API wire format (`/v1/responses`) as msgspec Structs: the schema of record.

`input` items are decoded in two steps: the body gives a list of JSON objects, and
`gateway.responses.items` converts each one by its `type` (a message may leave `type` out, which a
tagged union cannot express) so that an error names `input[i]...`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from msgspec import UNSET, Meta, Struct, UnsetType, field

from gateway.protocol import (
    ChatTokenLogprob,
    JumpForward,
    MinP,
    NonNegInt,
    Penalty,
    RepetitionPenalty,
    Temperature,
    TopP,
)

PositiveInt = Annotated[int, Meta(ge=1)]


# --------------------------------------------------------------------------- input items


class InputText(Struct, tag="input_text", tag_field="type"):
    text: str


class OutputText(Struct, tag="output_text", tag_field="type"):
    text: str
    annotations: list[Any] = field(default_factory=list)
    # filled only with include: ["message.output_text.logprobs"] (the chat logprob shape)
    logprobs: list[ChatTokenLogprob] = field(default_factory=list)


class Refusal(Struct, tag="refusal", tag_field="type"):
    refusal: str


ContentPart = Union[InputText, OutputText, Refusal]


class MessageItem(Struct, kw_only=True):
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[ContentPart]
    type: Literal["message"] = "message"
    id: str | None = None
    status: str | None = None


class FunctionCallItem(Struct, kw_only=True):
    call_id: str
    name: str
    arguments: str
    type: Literal["function_call"] = "function_call"
    id: str | None = None
    status: str | None = None


class FunctionCallOutputItem(Struct, kw_only=True):
    call_id: str
    output: str | list[ContentPart]
    type: Literal["function_call_output"] = "function_call_output"
    id: str | None = None
    status: str | None = None


InputItem = Union[MessageItem, FunctionCallItem, FunctionCallOutputItem]


# --------------------------------------------------------------------------- tools and formats


class FunctionTool(Struct, kw_only=True):
    """Responses' flat function tool (chat nests the same fields under `function`)."""

    name: str | None = None  # required for function tools (checked with the type, so that a built-in
    type: str = "function"  # tool such as web_search, which has no name, is refused by its type)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class NamedFunctionChoice(Struct, kw_only=True):
    name: str
    type: Literal["function"] = "function"


ResponseToolChoice = Union[Literal["none", "auto", "required"], NamedFunctionChoice]


class TextFormat(Struct, kw_only=True, omit_defaults=True):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema: dict[str, Any] | None = None
    description: str | None = None
    strict: bool | None = None


class TextConfig(Struct, kw_only=True):
    format: TextFormat = field(default_factory=lambda: TextFormat(type="text"))
    verbosity: str | None = None


# --------------------------------------------------------------------------- request


class ResponseRequest(Struct, kw_only=True):
    model: str
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: PositiveInt | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    seed: int | None = None
    stream: bool = False
    store: bool = True
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    text: TextConfig | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: ResponseToolChoice | None = None
    parallel_tool_calls: bool | None = None
    truncation: Literal["auto", "disabled"] | None = None
    top_logprobs: int | None = None  # alternatives per token, reported only with the logprobs include
    # {"effort": none..high, "summary": "auto"}: for a reasoning model (docs/reasoning.md)
    reasoning: dict[str, Any] | None = None
    # Accepted only at their neutral values (refused by name otherwise)
    background: bool | None = None
    include: list[str] | None = None  # only "message.output_text.logprobs"
    conversation: Any = None
    prompt: Any = None
    max_tool_calls: int | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    stream_options: dict[str, Any] | None = None
    # Jumpgate extensions (as on chat completions)
    stop: str | list[str] | None = None
    jump_forward: JumpForward | None = None
    cache_salt: str | None = None
    top_k: int | None = None
    min_p: MinP | None = None
    frequency_penalty: Penalty | None = None
    presence_penalty: Penalty | None = None
    repetition_penalty: RepetitionPenalty | None = None
    logit_bias: dict[str, float] | None = None
    min_tokens: NonNegInt | None = None
    stop_token_ids: list[NonNegInt] | None = None
    ignore_eos: bool = False


# --------------------------------------------------------------------------- response


class OutputMessage(Struct, tag="message", tag_field="type", kw_only=True):
    id: str
    content: list[OutputText]
    role: Literal["assistant"] = "assistant"
    status: Literal["completed", "incomplete", "in_progress"] = "completed"


class OutputFunctionCall(Struct, tag="function_call", tag_field="type", kw_only=True):
    id: str
    call_id: str
    name: str
    arguments: str
    status: Literal["completed", "incomplete", "in_progress"] = "completed"


class ReasoningText(Struct, tag="reasoning_text", tag_field="type"):
    text: str


class OutputReasoning(Struct, tag="reasoning", tag_field="type", kw_only=True):
    """A reasoning model's think block, as its raw text (no summary is written: `summary` is empty)."""

    id: str
    content: list[ReasoningText]
    summary: list[dict[str, Any]] = field(default_factory=list)
    status: Literal["completed", "incomplete", "in_progress"] = "completed"


OutputItem = Union[OutputReasoning, OutputMessage, OutputFunctionCall]


class InputTokensDetails(Struct):
    cached_tokens: int = 0


class OutputTokensDetails(Struct):
    reasoning_tokens: int = 0


class ResponseUsage(Struct):
    input_tokens: int
    output_tokens: int
    total_tokens: int
    input_tokens_details: InputTokensDetails = field(default_factory=InputTokensDetails)
    output_tokens_details: OutputTokensDetails = field(default_factory=OutputTokensDetails)


class IncompleteDetails(Struct):
    reason: Literal["max_output_tokens", "content_filter"]


class ResponseError(Struct):
    code: str
    message: str


class ResponseObject(Struct, kw_only=True):
    id: str
    created_at: int
    model: str
    status: Literal["completed", "incomplete", "in_progress", "failed"]
    output: list[OutputItem] = field(default_factory=list)
    usage: ResponseUsage | None = None
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    parallel_tool_calls: bool = True
    previous_response_id: str | None = None
    store: bool = True
    temperature: float | None = None
    top_p: float | None = None
    text: TextConfig = field(default_factory=TextConfig)
    tool_choice: ResponseToolChoice = "auto"
    tools: list[FunctionTool] = field(default_factory=list)
    truncation: str = "disabled"
    top_logprobs: int | None = None
    user: str | None = None
    background: bool = False
    reasoning: dict[str, Any] = field(default_factory=lambda: {"effort": None, "summary": None})
    object: Literal["response"] = "response"


class ResponseDeleted(Struct):
    id: str
    deleted: bool = True
    object: Literal["response.deleted"] = "response.deleted"


# --------------------------------------------------------------------------- stream events


class ResponseEvent(Struct, kw_only=True):
    """Any Responses stream event: fields unset for an event type are left out of the JSON."""

    type: str
    sequence_number: int
    response: ResponseObject | UnsetType = UNSET
    output_index: int | UnsetType = UNSET
    content_index: int | UnsetType = UNSET
    item_id: str | UnsetType = UNSET
    item: OutputItem | UnsetType = UNSET
    part: OutputText | ReasoningText | UnsetType = UNSET
    delta: str | UnsetType = UNSET
    text: str | UnsetType = UNSET
    arguments: str | UnsetType = UNSET
    name: str | UnsetType = UNSET
    logprobs: list[ChatTokenLogprob] | UnsetType = UNSET
