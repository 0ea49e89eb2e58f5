"""The OpenAI wire format (plus Jumpgate's extensions) as msgspec Structs: the schema of record.

Requests are decoded straight into these Structs; a type error names its JSON path, which
`gateway.errors` turns into the OpenAI `param`. Unknown request fields are ignored (as the OpenAI
API does), while known-but-unsupported options with non-default values are rejected in the routes.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType, field

JumpForward = Literal["verify", "direct", "off"]
# strict: every output fits the schema, or the schema is refused; best_effort: generate anyway and
# report on each choice whether the output validated (`jumpgate.schema_valid`)
SchemaMode = Literal["strict", "best_effort"]
FinishReason = Literal["stop", "length", "tool_calls", "content_filter"]

NonNegFloat = Annotated[float, Meta(ge=0)]
Temperature = Annotated[float, Meta(ge=0, le=2)]
TopP = Annotated[float, Meta(gt=0, le=1)]
MinP = Annotated[float, Meta(ge=0, le=1)]
PositiveInt = Annotated[int, Meta(ge=1)]
NonNegInt = Annotated[int, Meta(ge=0)]
RepetitionPenalty = Annotated[float, Meta(gt=0, le=2)]
Penalty = Annotated[float, Meta(ge=-2, le=2)]


# --------------------------------------------------------------------------- messages


class TextContentPart(Struct, tag="text", tag_field="type"):
    text: str


# Only text parts are accepted: an image part fails at `$.messages[i].content[j].type`.
Content = Union[str, list[TextContentPart]]


class FunctionCall(Struct):
    name: str
    arguments: str  # a JSON string, as OpenAI sends it


class ToolCall(Struct):
    id: str
    function: FunctionCall
    type: Literal["function"] = "function"


class SystemMessage(Struct, tag="system", tag_field="role"):
    content: Content
    name: str | None = None


class DeveloperMessage(Struct, tag="developer", tag_field="role"):
    """OpenAI's newer name for the system role; rendered as a system turn."""

    content: Content
    name: str | None = None


class UserMessage(Struct, tag="user", tag_field="role"):
    content: Content
    name: str | None = None


class AssistantMessage(Struct, tag="assistant", tag_field="role"):
    content: Content | None = None
    tool_calls: list[ToolCall] | None = None
    name: str | None = None
    refusal: str | None = None


class ToolMessage(Struct, tag="tool", tag_field="role"):
    content: Content
    tool_call_id: str


Message = Union[SystemMessage, DeveloperMessage, UserMessage, AssistantMessage, ToolMessage]


def content_text(content: Content | None) -> str:
    """The plain text of a message's content (text parts joined without a separator, as OpenAI does)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part.text for part in content)


# --------------------------------------------------------------------------- tools and formats


class FunctionDefinition(Struct):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDefinition(Struct):
    function: FunctionDefinition
    type: Literal["function"] = "function"


class NamedFunction(Struct):
    name: str


class NamedToolChoice(Struct):
    function: NamedFunction
    type: Literal["function"] = "function"


ToolChoice = Union[Literal["none", "auto", "required"], NamedToolChoice]


class JsonSchemaFormat(Struct):
    name: str = "response"
    schema: dict[str, Any] | None = None
    description: str | None = None
    strict: bool | None = None


class ResponseFormatText(Struct, tag="text", tag_field="type"):
    pass


class ResponseFormatJsonObject(Struct, tag="json_object", tag_field="type"):
    pass


class ResponseFormatJsonSchema(Struct, tag="json_schema", tag_field="type"):
    json_schema: JsonSchemaFormat


class ResponseFormatStructuralTag(Struct, tag="structural_tag", tag_field="type"):
    """XGrammar's structural tag as vLLM and SGLang accept it: `format` (current form), or the
    legacy `structures` ({begin, schema, end}) with `triggers`."""

    format: dict[str, Any] | None = None
    structures: list[dict[str, Any]] | None = None
    triggers: list[str] | None = None


ResponseFormat = Union[
    ResponseFormatText, ResponseFormatJsonObject, ResponseFormatJsonSchema, ResponseFormatStructuralTag
]


class StructuredOutputs(Struct, kw_only=True, forbid_unknown_fields=True):
    """vLLM's `structured_outputs` (its `StructuredOutputsParams`): one of the constraint fields."""

    json: dict[str, Any] | str | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: dict[str, Any] | str | None = None
    whitespace_pattern: str | None = None  # refused: Jumpgate's JSON whitespace is fixed
    # accepted without effect: Jumpgate never falls back to unconstrained output, writes JSON
    # without free whitespace, and a strict schema admits no undeclared property already
    disable_fallback: bool = False
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False


class StreamOptions(Struct):
    include_usage: bool = False


# --------------------------------------------------------------------------- requests


class _SamplingFields(Struct, kw_only=True):
    """Fields shared by chat and text completions (OpenAI's plus Jumpgate's extensions)."""

    model: str
    temperature: Temperature | None = None
    top_p: TopP | None = None
    n: PositiveInt = 1
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    frequency_penalty: Penalty | None = None
    presence_penalty: Penalty | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    # Jumpgate extensions
    regex: str | None = None
    ebnf: str | None = None
    schema_id: str | None = None
    schema_mode: SchemaMode | None = None
    jump_forward: JumpForward | None = None
    cache_salt: str | None = None
    top_k: int | None = None
    min_p: MinP | None = None
    ignore_eos: bool = False
    repetition_penalty: RepetitionPenalty | None = None  # vLLM's and SGLang's extension
    min_tokens: NonNegInt | None = None
    stop_token_ids: list[NonNegInt] | None = None
    # vLLM's request forms of a constraint (docs/structured-output.md): `structured_outputs`, and
    # the `guided_*` fields older clients still send (vLLM dropped them in 0.12)
    structured_outputs: StructuredOutputs | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_whitespace_pattern: str | None = None  # refused, as structured_outputs.whitespace_pattern
    guided_decoding_backend: str | None = None  # accepted, unused: the server picks its engines


class ChatCompletionRequest(_SamplingFields, kw_only=True):
    messages: list[Message]
    max_tokens: PositiveInt | None = None
    max_completion_tokens: PositiveInt | None = None
    response_format: ResponseFormat | None = None
    tools: list[ToolDefinition] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None  # 0..20, needs logprobs: true
    chat_template_kwargs: dict[str, Any] | None = None  # extra variables of the chat template
    # reasoning models (docs/reasoning.md): none | minimal | low | medium | high, and Jumpgate's
    # budget of the think block in tokens (what Anthropic's `thinking.budget_tokens` maps to)
    reasoning_effort: str | None = None
    thinking_budget: NonNegInt | None = None


# msgspec allows one array-like type per union, so the four OpenAI prompt shapes (str, [str],
# [int], [[int]]) are decoded as `str | list[...]` and checked for homogeneity in the route.
PromptItem = Union[str, int, list[int]]


class CompletionRequest(_SamplingFields, kw_only=True):
    prompt: str | list[PromptItem]
    max_tokens: PositiveInt | None = 16  # OpenAI's default for /v1/completions
    echo: bool = False
    suffix: str | None = None
    logprobs: int | None = None  # 0..5: the chosen token's logprob and that many alternatives
    best_of: int | None = None
    response_format: ResponseFormat | None = None  # extension: structured text completions


class CacheExplainRequest(ChatCompletionRequest, kw_only=True):
    """Same body as a chat completion; nothing is generated."""


# --------------------------------------------------------------------------- responses


class PromptTokensDetails(Struct):
    cached_tokens: int = 0


class CompletionTokensDetails(Struct):
    reasoning_tokens: int = 0  # tokens of the think block, its markers included


class Usage(Struct):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails = field(default_factory=PromptTokensDetails)
    completion_tokens_details: CompletionTokensDetails | UnsetType = UNSET  # a reasoning model's answers


def make_usage(
    prompt_tokens: int, completion_tokens: int, cached_tokens: int, reasoning_tokens: int | None = None
) -> Usage:
    """`reasoning_tokens` None: the request had no think block (no completion_tokens_details)."""
    return Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=cached_tokens),
        completion_tokens_details=UNSET
        if reasoning_tokens is None
        else CompletionTokensDetails(reasoning_tokens=reasoning_tokens),
    )


# Fields typed `X | UnsetType = UNSET` are left out of the JSON unless set (OpenAI omits them).


class SchemaViolation(Struct):
    pointer: str  # where in the output (JSON pointer; tool calls: /tool_calls/i/function/arguments/...)
    message: str
    schema_pointer: str | UnsetType = UNSET  # the schema keyword that failed


class ChoiceValidity(Struct):
    """Jumpgate's extension on a structured choice: did the final value validate against its schema?"""

    schema_valid: bool
    schema_mode: SchemaMode
    schema_errors: list[SchemaViolation] = field(default_factory=list)
    # strict closing completed the value as max_tokens neared: whole and valid (finish_reason
    # "stop"), but shorter than the model would have made it; absent otherwise
    closed_at_budget: bool | UnsetType = UNSET


class TopLogprob(Struct):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatTokenLogprob(Struct):
    token: str
    logprob: float
    bytes: list[int] | None
    top_logprobs: list[TopLogprob]
    forced: bool | UnsetType = UNSET  # Jumpgate: a direct jump-forward token (no model value; 0.0)


class ChoiceLogprobs(Struct):
    """A chat choice's (or chunk's) `logprobs`: what Jumpgate reports is in gateway/pipeline/logprobs.py."""

    content: list[ChatTokenLogprob] | None
    refusal: list[ChatTokenLogprob] | None = None


class CompletionLogprobs(Struct):
    """The legacy text-completion shape (parallel lists, one entry per token)."""

    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]] | None
    text_offset: list[int]


class ChatMessage(Struct):
    content: str | None
    role: Literal["assistant"] = "assistant"
    tool_calls: list[ToolCall] | UnsetType = UNSET
    reasoning_content: str | None | UnsetType = UNSET  # a reasoning model's think block (vLLM's field)


class ChatChoice(Struct):
    index: int
    message: ChatMessage
    finish_reason: FinishReason | None
    logprobs: ChoiceLogprobs | None = None
    jumpgate: ChoiceValidity | UnsetType = UNSET


class ChatCompletion(Struct):
    id: str
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    object: Literal["chat.completion"] = "chat.completion"
    system_fingerprint: str | None = None


class FunctionCallDelta(Struct):
    name: str | UnsetType = UNSET
    arguments: str | UnsetType = UNSET


class ToolCallDelta(Struct):
    index: int
    id: str | UnsetType = UNSET
    type: Literal["function"] | UnsetType = UNSET
    function: FunctionCallDelta | UnsetType = UNSET


class ChoiceDelta(Struct):
    role: Literal["assistant"] | UnsetType = UNSET
    content: str | UnsetType = UNSET
    reasoning_content: str | UnsetType = UNSET
    tool_calls: list[ToolCallDelta] | UnsetType = UNSET


class ChunkChoice(Struct):
    index: int
    delta: ChoiceDelta
    finish_reason: FinishReason | None = None
    logprobs: ChoiceLogprobs | None = None
    jumpgate: ChoiceValidity | UnsetType = UNSET  # on the chunk that finishes the choice


class ChatCompletionChunk(Struct):
    id: str
    created: int
    model: str
    choices: list[ChunkChoice]
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    usage: Usage | UnsetType = UNSET


class CompletionChoice(Struct):
    index: int
    text: str
    finish_reason: FinishReason | None
    logprobs: CompletionLogprobs | None = None
    jumpgate: ChoiceValidity | UnsetType = UNSET


class Completion(Struct):
    id: str
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    object: Literal["text_completion"] = "text_completion"


class CompletionChunk(Struct):
    id: str
    created: int
    model: str
    choices: list[CompletionChoice]
    object: Literal["text_completion"] = "text_completion"
    usage: Usage | UnsetType = UNSET


class Model(Struct):
    id: str
    created: int
    owned_by: str = "jumpgate"
    object: Literal["model"] = "model"
    max_model_len: int | None = None
    jumpgate: ModelFormatsInfo | UnsetType = UNSET  # the formats the model is served with


class ModelFormatsInfo(Struct):
    """The served model's formats, by xgrammar's names (`hermes`: Jumpgate's own)."""

    tool_call_format: str
    reasoning_format: str
    detected: bool  # from the chat template; False: set by --tool-call-format / --reasoning-format


class ModelList(Struct):
    data: list[Model]
    object: Literal["list"] = "list"


class ErrorDetail(Struct):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorBody(Struct):
    error: ErrorDetail


class Health(Struct):
    status: Literal["ok", "stopped"]
    model: str


def encode(obj: Any) -> bytes:
    return msgspec.json.encode(obj)
