"""Responses API ↔ the chat path: a `ResponseRequest` becomes a `ChatCompletionRequest` (so it goes
through the same planning, rendering and grammar as chat), and an engine outcome becomes output items.

Tools with an output format become a final-answer tool
(`gateway.pipeline.constraints.fold_format_into_tools`); a call of it comes back as the output
message's text.
"""

from __future__ import annotations

import re
import time
import uuid
from dataclasses import dataclass
from typing import Any

import msgspec

from gateway.errors import APIError, bad_request, describe_validation
from gateway.pipeline import grammar_adapter
from gateway.pipeline.constraints import fold_format_into_tools
from gateway.pipeline.generation import Outcome
from gateway.pipeline.reasoning import EFFORT_SHARE, model_thinks
from gateway.protocol import (
    AssistantMessage,
    ChatCompletionRequest,
    ChatTokenLogprob,
    DeveloperMessage,
    FunctionCall,
    FunctionDefinition,
    JsonSchemaFormat,
    Message,
    NamedFunction,
    NamedToolChoice,
    ResponseFormatJsonObject,
    ResponseFormatJsonSchema,
    SystemMessage,
    ToolCall,
    ToolDefinition,
    ToolMessage,
    UserMessage,
)
from gateway.responses.protocol import (
    ContentPart,
    FunctionCallItem,
    FunctionCallOutputItem,
    IncompleteDetails,
    InputItem,
    InputTokensDetails,
    MessageItem,
    NamedFunctionChoice,
    OutputFunctionCall,
    OutputItem,
    OutputMessage,
    OutputReasoning,
    OutputText,
    OutputTokensDetails,
    ReasoningText,
    Refusal,
    ResponseObject,
    ResponseRequest,
    ResponseUsage,
    TextConfig,
)
from runtime.decode.sampling import MAX_TOP_LOGPROBS

LOGPROBS_INCLUDE = "message.output_text.logprobs"
SUPPORTED_INCLUDE: frozenset[str] = frozenset({LOGPROBS_INCLUDE})

# chat parameter names in errors raised by the shared chat path → the Responses names
_PARAM_NAMES = {
    "messages": "input",
    "max_tokens": "max_output_tokens",
    "max_completion_tokens": "max_output_tokens",
    "response_format": "text.format",
    "response_format.json_schema.schema": "text.format.schema",
}


def responses_param(param: str | None) -> str | None:
    if param is None:
        return None
    if param.startswith("tools[") and ".function." in param:
        return param.replace(".function.", ".")
    return _PARAM_NAMES.get(param, param)


def wants_logprobs(req: ResponseRequest) -> bool:
    """Logprobs are reported only when `include` asks (OpenAI: `top_logprobs` alone reports none)."""
    return LOGPROBS_INCLUDE in (req.include or [])


def check_unsupported(req: ResponseRequest) -> None:
    """Options this server cannot honour are refused by name, never silently ignored."""
    for i, tool in enumerate(req.tools or []):
        if tool.type != "function":
            raise bad_request(
                f"Tool type '{tool.type}' is not supported by this server; only 'function' tools "
                "are (built-in tools such as web_search, file_search or computer_use are not).",
                f"tools[{i}].type",
                code="unsupported_tool",
            )
        if tool.name is None:
            raise bad_request(f"Missing required parameter: 'tools[{i}].name'.", f"tools[{i}].name")
    check_reasoning(req.reasoning)
    if req.background:
        raise bad_request("'background' is not supported by this server.", "background")
    for value in req.include or []:
        if value not in SUPPORTED_INCLUDE:
            raise bad_request(f"'include' value '{value}' is not supported by this server.", "include")
    if req.conversation is not None:
        raise bad_request(
            "'conversation' is not supported by this server; chain responses with 'previous_response_id'.",
            "conversation",
        )
    if req.prompt is not None:
        raise bad_request("'prompt' (stored prompt templates) is not supported by this server.", "prompt")
    if req.top_logprobs is not None and not 0 <= req.top_logprobs <= MAX_TOP_LOGPROBS:
        raise bad_request(f"'top_logprobs' must be between 0 and {MAX_TOP_LOGPROBS}.", "top_logprobs")
    if wants_logprobs(req) and req.tools:
        raise bad_request(
            f"'include' value '{LOGPROBS_INCLUDE}' is not supported together with 'tools' by this "
            "server (the message text would not line up with the generated tokens).",
            "include",
        )
    if req.truncation == "auto":
        raise bad_request("'truncation' 'auto' is not supported by this server (use 'disabled').", "truncation")
    if req.max_tool_calls is not None:
        raise bad_request("'max_tool_calls' is not supported by this server.", "max_tool_calls")


REASONING_KEYS = ("effort", "summary")


def check_reasoning(reasoning: dict[str, Any] | None) -> None:
    """`reasoning` is for a model that writes a think block: its effort (as chat's
    `reasoning_effort`) and summary "auto" (the raw block is given; no summary is written)."""
    if not reasoning or all(v is None for v in reasoning.values()):
        return
    if not model_thinks():
        raise bad_request("'reasoning' is not supported by this server (the model writes no think block).", "reasoning")
    for key, value in reasoning.items():
        if key not in REASONING_KEYS:
            raise bad_request(f"'reasoning.{key}' is not supported by this server.", f"reasoning.{key}")
        if key == "summary" and value not in (None, "auto"):
            raise bad_request(
                f"'reasoning.summary' {value!r} is not supported by this server: the raw think block is "
                "given as the reasoning item's content, with no summary (send 'auto' or leave it out).",
                "reasoning.summary",
            )
    effort = reasoning.get("effort")
    if effort is not None and effort not in EFFORT_SHARE:
        raise bad_request(
            f"'reasoning.effort' must be one of {', '.join(EFFORT_SHARE)}; got {effort!r}.", "reasoning.effort"
        )


# --------------------------------------------------------------------------- input → messages


def parts_text(content: str | list[ContentPart]) -> str:
    if isinstance(content, str):
        return content
    return "".join(p.refusal if isinstance(p, Refusal) else p.text for p in content)


def decode_item(raw: Any, index: int) -> InputItem | None:
    """One `input` element by its `type` (a message may leave it out); errors name `input[i]`;
    None: a reasoning item (handed back by clients that replay a turn's output)."""
    if not isinstance(raw, dict):
        raise bad_request(f"Invalid value for 'input[{index}]': expected an object.", f"input[{index}]")
    kind = raw.get("type", "message")
    if kind == "reasoning":
        return None  # an earlier turn's think block: templates drop it from the prompt as well
    types: dict[str, type] = {
        "message": MessageItem,
        "function_call": FunctionCallItem,
        "function_call_output": FunctionCallOutputItem,
    }
    if kind not in types:
        raise bad_request(
            f"Input item type '{kind}' is not supported by this server (supported: message, "
            "function_call, function_call_output).",
            f"input[{index}].type",
        )
    if kind == "message" and isinstance(raw.get("content"), list):
        for j, part in enumerate(raw["content"]):
            ptype = part.get("type") if isinstance(part, dict) else None
            if ptype not in ("input_text", "output_text", "refusal"):
                raise bad_request(
                    f"Content part type '{ptype}' is not supported by this server (text only).",
                    f"input[{index}].content[{j}].type",
                )
    try:
        return msgspec.convert(raw, types[kind])
    except msgspec.ValidationError as exc:
        text = str(exc)
        m = re.search(r" - at `\$(?P<path>[^`]*)`$", text)
        where = m.group("path") if m else ""
        message, param = describe_validation(text[: m.start()] if m else text, f"input[{index}]{where}")
        raise bad_request(message, param) from exc


def input_messages(input: str | list[dict[str, Any]]) -> list[Message]:
    """Responses input items as chat messages: consecutive function_call items join one assistant
    turn (with the assistant text before them), function_call_output items become tool results."""
    if isinstance(input, str):
        return [UserMessage(content=input)]
    if not input:
        raise bad_request("'input' must not be empty.", "input")
    messages: list[Message] = []
    for index, raw in enumerate(input):
        item = decode_item(raw, index)
        if item is None:
            continue
        if isinstance(item, MessageItem):
            text = parts_text(item.content)
            cls = {"user": UserMessage, "system": SystemMessage, "developer": DeveloperMessage}.get(item.role)
            messages.append(cls(content=text) if cls else AssistantMessage(content=text))
        elif isinstance(item, FunctionCallItem):
            call = ToolCall(id=item.call_id, function=FunctionCall(name=item.name, arguments=item.arguments))
            last = messages[-1] if messages else None
            if isinstance(last, AssistantMessage):
                last.tool_calls = (last.tool_calls or []) + [call]
            else:
                messages.append(AssistantMessage(content=None, tool_calls=[call]))
        else:
            messages.append(ToolMessage(content=parts_text(item.output), tool_call_id=item.call_id))
    return messages


# --------------------------------------------------------------------------- request → chat request


@dataclass
class ChatPlan:
    chat: ChatCompletionRequest
    history: list[Message]  # previous turns + this request's input (no instructions): what is stored
    answer_tool: str | None  # the synthetic tool whose call is the final answer (tools + format)


def to_chat_request(req: ResponseRequest, previous: list[Message]) -> ChatPlan:
    new = input_messages(req.input)
    history = previous + new
    messages: list[Message] = ([SystemMessage(content=req.instructions)] if req.instructions else []) + history
    fmt = (req.text or TextConfig()).format
    response_format: Any = None
    if fmt.type == "json_object":
        response_format = ResponseFormatJsonObject()
    elif fmt.type == "json_schema":
        if fmt.schema is None:
            raise bad_request("text.format.schema is required for a json_schema format.", "text.format.schema")
        response_format = ResponseFormatJsonSchema(
            json_schema=JsonSchemaFormat(
                name=fmt.name or "response", schema=fmt.schema, description=fmt.description, strict=fmt.strict
            )
        )

    tools = None
    if req.tools:  # Responses clients send [] for "no tools" (chat refuses an empty list)
        tools = [
            ToolDefinition(
                function=FunctionDefinition(
                    name=t.name or "", description=t.description, parameters=t.parameters, strict=t.strict
                )
            )
            for t in req.tools
        ]
    choice: Any = req.tool_choice
    if isinstance(choice, NamedFunctionChoice):
        choice = NamedToolChoice(function=NamedFunction(name=choice.name))
    parallel = req.parallel_tool_calls

    chat = ChatCompletionRequest(
        model=req.model,
        messages=messages,
        max_tokens=req.max_output_tokens,
        temperature=req.temperature,
        top_p=req.top_p,
        seed=req.seed,
        stop=req.stop,
        user=req.user,
        response_format=response_format,
        tools=tools,
        tool_choice=choice,
        parallel_tool_calls=parallel,
        jump_forward=req.jump_forward,
        cache_salt=req.cache_salt,
        top_k=req.top_k,
        min_p=req.min_p,
        frequency_penalty=req.frequency_penalty,
        presence_penalty=req.presence_penalty,
        repetition_penalty=req.repetition_penalty,
        logit_bias=req.logit_bias,
        min_tokens=req.min_tokens,
        stop_token_ids=req.stop_token_ids,
        ignore_eos=req.ignore_eos,
        logprobs=True if wants_logprobs(req) else None,
        top_logprobs=(req.top_logprobs or 0) if wants_logprobs(req) else None,
        reasoning_effort=(req.reasoning or {}).get("effort"),
    )
    answer_tool = fold_format_into_tools(chat, "text.format.schema")
    return ChatPlan(chat=chat, history=history, answer_tool=answer_tool)


def renamed(exc: APIError) -> APIError:
    """An error from the shared chat path, with the parameter as the Responses API names it."""
    param = responses_param(exc.param)
    if param != exc.param:
        exc.message = exc.message.replace(f"'{exc.param}'", f"'{param}'")
        exc.param = param
    return exc


# --------------------------------------------------------------------------- outcome → response


def item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def output_items(
    text: str,
    parse_tool_calls: bool,
    answer_tool: str | None,
    status: str,
    logprobs: list[ChatTokenLogprob] | None = None,
    reasoning: str | None = None,
) -> list[OutputItem]:
    """`logprobs` (all generated tokens) go on the message text; requests with tools never have them.
    `reasoning`: the think block (None: the request had none), the first item where it is not empty."""
    content, calls = grammar_adapter.parse_tool_calls(text) if parse_tool_calls else (text, [])
    items: list[OutputItem] = []
    if reasoning:
        items.append(OutputReasoning(id=item_id("rs"), content=[ReasoningText(text=reasoning)], status=status))  # type: ignore[arg-type]
    answers = [c.arguments for c in calls if c.name == answer_tool]
    message_text = (content or "") + "".join(answers)
    if message_text or not calls:
        items.append(
            OutputMessage(
                id=item_id("msg"), content=[OutputText(text=message_text, logprobs=logprobs or [])], status=status
            )
        )  # type: ignore[arg-type]
    for c in calls:
        if c.name != answer_tool:
            items.append(
                OutputFunctionCall(id=item_id("fc"), call_id=c.id, name=c.name, arguments=c.arguments, status=status)
            )  # type: ignore[arg-type]
    return items


def usage_of(outcome: Outcome) -> ResponseUsage:
    return ResponseUsage(
        input_tokens=outcome.prompt_tokens,
        output_tokens=outcome.completion_tokens,
        total_tokens=outcome.prompt_tokens + outcome.completion_tokens,
        input_tokens_details=InputTokensDetails(cached_tokens=outcome.cached_tokens),
        output_tokens_details=OutputTokensDetails(reasoning_tokens=outcome.reasoning_tokens),
    )


def status_of(outcome: Outcome) -> tuple[str, IncompleteDetails | None]:
    if outcome.finish_reason == "length":
        return "incomplete", IncompleteDetails(reason="max_output_tokens")
    return "completed", None


def response_shell(req: ResponseRequest, response_id: str, created_at: int | None = None) -> ResponseObject:
    """The response object before any output (the form `response.created` carries)."""
    return ResponseObject(
        id=response_id,
        created_at=created_at or int(time.time()),
        model=req.model,
        status="in_progress",
        instructions=req.instructions,
        max_output_tokens=req.max_output_tokens,
        metadata=dict(req.metadata or {}),
        parallel_tool_calls=True if req.parallel_tool_calls is None else req.parallel_tool_calls,
        previous_response_id=req.previous_response_id,
        store=req.store,
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        text=req.text or TextConfig(),
        tool_choice=req.tool_choice or "auto",
        tools=list(req.tools or []),
        user=req.user,
        top_logprobs=req.top_logprobs,
        reasoning={"effort": (req.reasoning or {}).get("effort"), "summary": (req.reasoning or {}).get("summary")},
    )


def finished_response(shell: ResponseObject, outcome: Outcome, items: list[OutputItem]) -> ResponseObject:
    status, incomplete = status_of(outcome)
    return msgspec.structs.replace(
        shell, status=status, incomplete_details=incomplete, output=items, usage=usage_of(outcome)
    )
