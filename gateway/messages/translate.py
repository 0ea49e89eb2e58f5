"""Messages request → the shared chat request (`ChatCompletionRequest`), so it goes through the
same planning, rendering and grammar as chat.

`system` becomes the leading system message, `tool_use` blocks assistant tool calls, `tool_result`
blocks tool messages; `tools[].input_schema` become function parameters (strict, as every Jumpgate
tool is, unless `strict: false`), `tool_choice` auto/any/tool/none becomes auto/required/named/none,
`output_config.format` a json_schema response format (with tools: the final-answer tool,
`gateway.pipeline.constraints.fold_format_into_tools`). Errors name the Anthropic fields.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import msgspec

from gateway.errors import APIError, bad_request, describe_validation
from gateway.messages.protocol import (
    BLOCK_TYPES,
    CountTokensRequest,
    CustomTool,
    InputBlock,
    MessagesRequest,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolChoiceAny,
    ToolChoiceAuto,
    ToolChoiceNone,
    ToolChoiceTool,
    ToolResultBlock,
    ToolUseBlock,
)
from gateway.pipeline.constraints import fold_format_into_tools
from gateway.pipeline.reasoning import model_thinks
from gateway.protocol import (
    AssistantMessage,
    ChatCompletionRequest,
    FunctionCall,
    FunctionDefinition,
    JsonSchemaFormat,
    Message,
    NamedFunction,
    NamedToolChoice,
    ResponseFormatJsonSchema,
    SystemMessage,
    ToolCall,
    ToolDefinition,
    ToolMessage,
    UserMessage,
)

# chat parameter names in errors raised by the shared chat path → the Messages names
_PARAM_NAMES = {
    "stop": "stop_sequences",
    "response_format": "output_config.format",
    "response_format.json_schema.schema": "output_config.format.schema",
    "max_completion_tokens": "max_tokens",
}
_TOOL_PARAM = re.compile(r"^tools\[(\d+)\]\.function\.(name|parameters)")
EFFORT_ALLOWED = (None, "high")  # Anthropic's default: what this server does anyway


THINKING_TYPES = ("enabled", "adaptive", "disabled")
# Anthropic's efforts → reasoning_effort (the think block's share of max_tokens, gateway.pipeline.reasoning)
EFFORTS = {"low": "low", "medium": "medium", "high": "high", "max": "high"}


def check_thinking(req: CountTokensRequest) -> None:
    thinking = req.thinking
    if thinking is not None:
        if thinking.type not in THINKING_TYPES:
            raise bad_request(
                f"'thinking.type' must be one of {', '.join(THINKING_TYPES)}; got {thinking.type!r}.", "thinking.type"
            )
        if thinking.type == "enabled" and thinking.budget_tokens is None:
            raise bad_request(
                "'thinking.budget_tokens' is required when thinking is enabled.", "thinking.budget_tokens"
            )
        if thinking.budget_tokens is not None:
            if thinking.budget_tokens < 1:
                raise bad_request("'thinking.budget_tokens' must be at least 1.", "thinking.budget_tokens")
            max_tokens = getattr(req, "max_tokens", None)
            if max_tokens is not None and thinking.budget_tokens >= max_tokens:
                raise bad_request(
                    f"'max_tokens' ({max_tokens}) must be greater than 'thinking.budget_tokens' "
                    f"({thinking.budget_tokens}).",
                    "thinking.budget_tokens",
                )
    effort = req.output_config.effort if req.output_config else None
    if effort is not None and effort not in EFFORTS:
        raise bad_request(
            f"'output_config.effort' must be one of {', '.join(EFFORTS)}; got {effort!r}.", "output_config.effort"
        )


def thinking_fields(req: CountTokensRequest) -> dict[str, Any]:
    """`thinking` in chat's terms. As on Anthropic's API, a request that does not enable thinking
    gets no think block (`reasoning_effort` "none": the template's `enable_thinking` false)."""
    if not model_thinks():
        return {}
    thinking = req.thinking
    if thinking is None or thinking.type == "disabled":
        return {"reasoning_effort": "none"}
    effort = req.output_config.effort if req.output_config else None
    return {"thinking_budget": thinking.budget_tokens, "reasoning_effort": EFFORTS.get(effort or "", None)}


@dataclass
class Breakpoint:
    """A `cache_control` mark: the prompt up to the end of `text` (found after the earlier marks)."""

    message: int  # index in the Messages `messages` (-1: system or tools)
    text: str | None  # the block's text as rendered; None: the whole system block


@dataclass
class MessagesPlan:
    chat: ChatCompletionRequest
    answer_tool: str | None  # the synthetic final-answer tool (tools + output_config.format)
    breakpoints: list[Breakpoint] = field(default_factory=list)
    cache_ttl: str | None = None  # the longest ttl asked ("5m" / "1h")


def messages_param(param: str | None) -> str | None:
    if param is None:
        return None
    if param.startswith("stop["):
        return "stop_sequences" + param[len("stop") :]
    m = _TOOL_PARAM.match(param)
    if m:
        return f"tools[{m.group(1)}].{'name' if m.group(2) == 'name' else 'input_schema'}" + param[m.end() :]
    return _PARAM_NAMES.get(param, param)


def renamed(exc: APIError) -> APIError:
    """An error from the shared chat path, with the parameter as the Messages API names it."""
    param = messages_param(exc.param)
    if param != exc.param:
        exc.message = exc.message.replace(f"'{exc.param}'", f"'{param}'")
        exc.param = param
    exc.message = exc.message.replace("tool_choice names the function", "tool_choice names the tool")
    return exc


def _convert(raw: Any, type_: type, where: str) -> Any:
    try:
        return msgspec.convert(raw, type_)
    except msgspec.ValidationError as exc:
        text = str(exc)
        m = re.search(r" - at `\$(?P<path>[^`]*)`$", text)
        message, param = describe_validation(text[: m.start()] if m else text, where + (m.group("path") if m else ""))
        raise bad_request(message, param) from exc


def decode_block(raw: Any, where: str) -> InputBlock:
    """One content block by its `type`; an unsupported type is refused by name at `where`."""
    kind = raw.get("type") if isinstance(raw, dict) else None
    if kind not in BLOCK_TYPES:
        what = f"'{kind}'" if isinstance(kind, str) else "missing"
        raise bad_request(
            f"Content block type {what} at '{where}.type' is not supported by this server "
            "(supported: text, tool_use, tool_result, thinking, redacted_thinking).",
            f"{where}.type",
        )
    return _convert(raw, BLOCK_TYPES[kind], where)


def decode_tool(raw: Any, index: int) -> CustomTool:
    where = f"tools[{index}]"
    kind = raw.get("type") if isinstance(raw, dict) else None
    if kind not in (None, "custom"):
        raise bad_request(
            f"Tool type '{kind}' at '{where}.type' is not supported by this server; only custom tools "
            "(name + input_schema) are (server tools such as web_search, bash or text_editor are not).",
            f"{where}.type",
        )
    tool = _convert(raw, CustomTool, where)
    if tool.input_schema.get("type") != "object":
        raise bad_request(f"'{where}.input_schema' must be a JSON schema of type 'object'.", f"{where}.input_schema")
    return tool


def check_unsupported(req: CountTokensRequest) -> None:
    """Options this server cannot honour are refused by name, never silently ignored."""
    thinking = req.thinking
    effort = req.output_config.effort if req.output_config else None
    if not model_thinks():
        if thinking is not None and thinking.type != "disabled":
            raise bad_request(
                f"'thinking' of type '{thinking.type}' is not supported: the served model has no reasoning "
                'format. Send {"type": "disabled"} or leave \'thinking\' out.',
                "thinking",
            )
        if effort not in EFFORT_ALLOWED:
            raise bad_request(
                f"'output_config.effort' '{effort}' is not supported: the served model has no reasoning "
                "format, so only the default effort 'high' is served.",
                "output_config.effort",
            )
    else:
        check_thinking(req)
    if not req.messages:
        raise bad_request("'messages' must contain at least one message.", "messages")
    if req.messages[-1].role == "assistant":
        raise bad_request(
            "Prefilling the assistant's response (a last message with role 'assistant') is not "
            "supported by this server.",
            f"messages[{len(req.messages) - 1}].role",
        )


def system_text(req: CountTokensRequest, plan: MessagesPlan) -> str | None:
    if req.system is None or isinstance(req.system, str):
        return req.system or None
    texts = []
    for i, raw in enumerate(req.system):
        block = decode_block(raw, f"system[{i}]")
        if not isinstance(block, TextBlock):
            raise bad_request(f"'system[{i}]' must be a text block.", f"system[{i}].type")
        texts.append(block.text)
        mark(plan, block.cache_control, -1, None)
    return "\n\n".join(texts) or None


def mark(plan: MessagesPlan, cache_control: Any, message: int, text: str | None) -> None:
    if cache_control is None:
        return
    plan.breakpoints.append(Breakpoint(message, text))
    if cache_control.ttl == "1h" or plan.cache_ttl is None:
        plan.cache_ttl = cache_control.ttl or "5m"


def result_text(block: ToolResultBlock) -> str:
    content = block.content
    text = content if isinstance(content, str) else "".join(b.text for b in content or [])
    return f"Error: {text}" if block.is_error else text


def chat_messages(req: CountTokensRequest, plan: MessagesPlan) -> list[Message]:
    """Each Messages turn as chat messages: a user turn's tool_result blocks become tool messages
    (in order, text between them a user message), an assistant turn's tool_use blocks its calls."""
    out: list[Message] = []
    for i, msg in enumerate(req.messages):
        where = f"messages[{i}]"
        blocks: list[InputBlock]
        if isinstance(msg.content, str):
            blocks = [TextBlock(text=msg.content)]
        else:
            blocks = [decode_block(raw, f"{where}.content[{j}]") for j, raw in enumerate(msg.content)]
        if msg.role == "assistant":
            out.append(assistant_message(blocks, where, plan, i))
            continue
        texts: list[str] = []
        for j, block in enumerate(blocks):
            if isinstance(block, TextBlock):
                texts.append(block.text)
            elif isinstance(block, ToolResultBlock):
                if texts:
                    out.append(UserMessage(content="\n\n".join(texts)))
                    texts = []
                out.append(ToolMessage(content=result_text(block), tool_call_id=block.tool_use_id))
            elif isinstance(block, ToolUseBlock):
                raise bad_request(
                    f"A 'tool_use' block must be in an assistant message ('{where}.content[{j}]').",
                    f"{where}.content[{j}].type",
                )
            else:
                raise bad_request(
                    f"A '{type(block).__name__}' block must be in an assistant message ('{where}.content[{j}]').",
                    f"{where}.content[{j}].type",
                )
            mark(
                plan,
                getattr(block, "cache_control", None),
                i,
                block.text if isinstance(block, TextBlock) else result_text(block),
            )  # type: ignore[arg-type]
        if texts:
            out.append(UserMessage(content="\n\n".join(texts)))
    return out


def assistant_message(blocks: list[InputBlock], where: str, plan: MessagesPlan, index: int) -> AssistantMessage:
    texts: list[str] = []
    calls: list[ToolCall] = []
    for j, block in enumerate(blocks):
        if isinstance(block, TextBlock):
            texts.append(block.text)
            mark(plan, block.cache_control, index, block.text)
        elif isinstance(block, ToolUseBlock):
            calls.append(
                ToolCall(
                    id=block.id,
                    function=FunctionCall(
                        name=block.name, arguments=json.dumps(block.input, separators=(",", ":"), ensure_ascii=False)
                    ),
                )
            )
            mark(plan, block.cache_control, index, block.name)
        elif isinstance(block, (ThinkingBlock, RedactedThinkingBlock)):
            continue  # an earlier turn's reasoning: templates leave past think blocks out
        else:
            raise bad_request(
                f"A 'tool_result' block must be in a user message ('{where}.content[{j}]').",
                f"{where}.content[{j}].type",
            )
    return AssistantMessage(content="".join(texts) or None, tool_calls=calls or None)


def chat_tools(req: CountTokensRequest, plan: MessagesPlan) -> tuple[list[ToolDefinition] | None, Any, bool | None]:
    """(tools, tool_choice, parallel_tool_calls) in chat's terms."""
    tools = None
    if req.tools:
        decoded = [decode_tool(raw, i) for i, raw in enumerate(req.tools)]
        for t in decoded:
            mark(plan, t.cache_control, -1, None)
        tools = [
            ToolDefinition(
                function=FunctionDefinition(
                    name=t.name, description=t.description, parameters=t.input_schema, strict=t.strict
                )
            )
            for t in decoded
        ]
    choice = req.tool_choice
    if choice is None:
        return tools, None, None
    parallel = None if isinstance(choice, ToolChoiceNone) or not choice.disable_parallel_tool_use else False
    if isinstance(choice, (ToolChoiceAuto, ToolChoiceNone)):
        if tools is None:
            return None, None, None  # "auto"/"none" without tools means no tools, as Anthropic takes it
        return tools, "auto" if isinstance(choice, ToolChoiceAuto) else "none", parallel
    if tools is None:
        raise bad_request(
            f"'tool_choice' of type '{'any' if isinstance(choice, ToolChoiceAny) else 'tool'}' needs 'tools'.",
            "tool_choice",
        )
    if isinstance(choice, ToolChoiceAny):
        return tools, "required", parallel
    assert isinstance(choice, ToolChoiceTool)
    if choice.name not in {t.function.name for t in tools}:
        raise bad_request(f"'tool_choice' names the tool '{choice.name}', which is not in 'tools'.", "tool_choice.name")
    return tools, NamedToolChoice(function=NamedFunction(name=choice.name)), parallel


def to_chat_request(req: CountTokensRequest) -> MessagesPlan:
    """The chat request for `req` (a `MessagesRequest`, or a `CountTokensRequest` for counting)."""
    check_unsupported(req)
    plan = MessagesPlan(chat=None, answer_tool=None)  # type: ignore[arg-type]
    system = system_text(req, plan)
    tools, choice, parallel = chat_tools(req, plan)
    messages: list[Message] = ([SystemMessage(content=system)] if system else []) + chat_messages(req, plan)
    if req.cache_control is not None:  # automatic caching: a mark on the last block
        plan.breakpoints.append(Breakpoint(len(req.messages) - 1, None))
        plan.cache_ttl = req.cache_control.ttl or plan.cache_ttl or "5m"
    fmt = req.output_config.format if req.output_config else None
    response_format = None
    if fmt is not None:
        response_format = ResponseFormatJsonSchema(json_schema=JsonSchemaFormat(name="output", schema=fmt.schema))
    fields: dict[str, Any] = {}
    if isinstance(req, MessagesRequest):
        fields = dict(
            max_tokens=req.max_tokens,
            stop=req.stop_sequences,
            stream=req.stream,
            temperature=req.temperature,
            top_p=req.top_p,
            top_k=req.top_k,
            seed=req.seed,
            min_p=req.min_p,
            user=req.metadata.user_id if req.metadata else None,
            frequency_penalty=req.frequency_penalty,
            presence_penalty=req.presence_penalty,
            repetition_penalty=req.repetition_penalty,
            logit_bias=req.logit_bias,
            min_tokens=req.min_tokens,
            stop_token_ids=req.stop_token_ids,
            ignore_eos=req.ignore_eos,
            jump_forward=req.jump_forward,
            cache_salt=req.cache_salt,
            schema_mode=req.schema_mode,
        )
    plan.chat = ChatCompletionRequest(
        model=req.model,
        messages=messages,
        response_format=response_format,
        tools=tools,
        tool_choice=choice,
        parallel_tool_calls=parallel,
        **fields,
        **thinking_fields(req),
    )
    plan.answer_tool = fold_format_into_tools(plan.chat, "output_config.format.schema")
    return plan
