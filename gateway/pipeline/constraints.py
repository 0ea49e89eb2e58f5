"""Request fields → one grammar spec (or none), checked for conflicts, compiled through `grammar`.

Sources of a constraint: `response_format` (json_object / json_schema / structural_tag), `tools` +
`tool_choice`, Jumpgate's `regex`, `ebnf`, `schema_id` (a registered schema, regex, EBNF grammar or
tool set), and vLLM's forms (`structured_outputs`, `guided_*`). At most one may shape the output;
tools with tool_choice "none" are shown in the prompt only.

Tools together with an output format (`fold_format_into_tools`): agent frameworks (the OpenAI
Agents SDK with an `output_type`) send function tools *and* a JSON schema, meaning "call a tool, or
give the final answer in this shape". The tool-call grammar knows only calls and free text, so the
answer becomes a tool, `final_answer`, whose arguments are the schema: tool_choice "auto" turns
into "required" over the tools plus that one (one call per turn), and a call of it goes back to the
client as the message content. With tool_choice "required" or a named tool the turn is a call, so
the format is left for a later turn.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gateway.errors import APIError, bad_request, not_found, overloaded
from gateway.pipeline import grammar_adapter
from gateway.pipeline.schema_registry import SchemaRegistry, valid_id
from gateway.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    FunctionDefinition,
    NamedToolChoice,
    ResponseFormatJsonObject,
    ResponseFormatJsonSchema,
    ResponseFormatStructuralTag,
    ToolDefinition,
)

if TYPE_CHECKING:  # types only: importing grammar's service pulls in xgrammar
    from grammar import GrammarService, GrammarSpec
    from runtime.constraint import CompiledConstraint


@dataclass
class ConstraintPlan:
    kind: str | None = None  # grammar spec kind; None = free text
    payload: Any = None
    param: str | None = None  # the request field the constraint came from (error messages)
    label: str = ""  # e.g. "response_format 'weather'"
    tools: list[dict[str, Any]] | None = None  # tools shown in the prompt
    instructions: str | None = None  # schema text for the prompt's system block
    parse_tool_calls: bool = False
    strict: bool = False

    @property
    def spec(self) -> GrammarSpec | None:
        return None if self.kind is None else grammar_adapter.make_spec(self.kind, self.payload, self.strict)


def tool_dict(tool: ToolDefinition) -> dict[str, Any]:
    fn: dict[str, Any] = {"name": tool.function.name}
    if tool.function.description is not None:
        fn["description"] = tool.function.description
    if tool.function.parameters is not None:
        fn["parameters"] = tool.function.parameters
    if tool.function.strict is not None:
        fn["strict"] = tool.function.strict
    return {"type": "function", "function": fn}


def check_tools(tools: list[ToolDefinition], param: str = "tools") -> list[dict[str, Any]]:
    if not tools:
        raise bad_request(f"'{param}' must contain at least one tool.", param)
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        name = tool.function.name
        if not grammar_adapter.valid_tool_name(name):
            raise bad_request(
                f"Invalid tool name {name!r}: use 1-64 letters, digits, underscores or dashes.",
                f"{param}[{i}].function.name",
            )
        if name in seen:
            raise bad_request(f"Duplicate tool name {name!r}.", f"{param}[{i}].function.name")
        seen.add(name)
    return [tool_dict(t) for t in tools]


def lookup_schema(registry: SchemaRegistry, tenant: str, schema_id: str) -> Any:
    entry = registry.get(tenant, schema_id) if valid_id(schema_id) else None
    if entry is None:
        raise not_found(f"No registered schema with id '{schema_id}'.", "schema_id", code="schema_not_found")
    return entry


def _format_sources(req: ChatCompletionRequest | CompletionRequest) -> list[tuple[str, str, Any, str, bool]]:
    """(param, kind, payload, label, strict) for each output-shaping field set on the request."""
    sources: list[tuple[str, str, Any, str, bool]] = []
    rf = req.response_format
    if isinstance(rf, ResponseFormatJsonObject):
        sources.append(
            ("response_format", "json_object", None, "response_format", grammar_adapter.strict_closing("json_object"))
        )
    elif isinstance(rf, ResponseFormatJsonSchema):
        js = rf.json_schema
        if js.schema is None:
            raise bad_request("response_format.json_schema.schema is required.", "response_format.json_schema.schema")
        # strict unless the client says otherwise: no free extra properties for a small model to loop on
        strict = js.strict is not False
        sources.append(("response_format.json_schema.schema", "json_schema", js.schema, f"schema '{js.name}'", strict))
    elif isinstance(rf, ResponseFormatStructuralTag):
        if rf.format is not None:
            tag: Any = {"format": rf.format}
        elif rf.structures is not None:
            tag = {"structures": rf.structures, "triggers": rf.triggers or []}
        else:
            raise bad_request(
                "A structural_tag response_format needs 'format' (or the legacy 'structures' with 'triggers').",
                "response_format",
            )
        sources.append(
            (
                "response_format",
                "structural_tag",
                tag,
                "structural tag",
                grammar_adapter.strict_closing("structural_tag"),
            )
        )
    if req.regex is not None:
        if not req.regex:
            raise bad_request("'regex' must not be empty.", "regex")
        sources.append(("regex", "regex", req.regex, "regex", grammar_adapter.strict_closing("regex")))
    if req.ebnf is not None:
        if not req.ebnf.strip():
            raise bad_request("'ebnf' must not be empty.", "ebnf")
        sources.append(("ebnf", "ebnf", req.ebnf, "EBNF grammar", grammar_adapter.strict_closing("ebnf")))
    sources += _vllm_sources(req)
    return sources


def _json_value(value: Any, param: str) -> Any:
    """A JSON object given as itself or as its text (vLLM takes both)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise bad_request(f"'{param}' is not valid JSON: {exc}", param) from exc
    if not isinstance(value, dict):
        raise bad_request(f"'{param}' must be a JSON object.", param)
    return value


def _vllm_sources(req: ChatCompletionRequest | CompletionRequest) -> list[tuple[str, str, Any, str, bool]]:
    """vLLM's `structured_outputs` fields and the older `guided_*` fields, as constraint sources."""
    so = req.structured_outputs
    fields: list[tuple[str, Any, str]] = [
        ("guided_json", req.guided_json, "json_schema"),
        ("guided_regex", req.guided_regex, "regex"),
        ("guided_choice", req.guided_choice, "choice"),
        ("guided_grammar", req.guided_grammar, "ebnf"),
    ]
    whitespace = [("guided_whitespace_pattern", req.guided_whitespace_pattern)]
    if so is not None:
        fields += [
            ("structured_outputs.json", so.json, "json_schema"),
            ("structured_outputs.regex", so.regex, "regex"),
            ("structured_outputs.choice", so.choice, "choice"),
            ("structured_outputs.grammar", so.grammar, "ebnf"),
            ("structured_outputs.structural_tag", so.structural_tag, "structural_tag"),
        ]
        whitespace.append(("structured_outputs.whitespace_pattern", so.whitespace_pattern))
    for param, pattern in whitespace:
        if pattern is not None:
            raise bad_request(
                f"'{param}' is not supported: JSON is written without free whitespace.", param, code="unsupported"
            )
    sources: list[tuple[str, str, Any, str, bool]] = []
    for param, value, kind in fields:
        if value is None:
            continue
        if kind in ("json_schema", "structural_tag"):
            value = _json_value(value, param)
        elif isinstance(value, str) and not value.strip():
            raise bad_request(f"'{param}' must not be empty.", param)
        # a schema is strict, as response_format's is by default; other kinds as their own field
        strict = True if kind == "json_schema" else grammar_adapter.strict_closing(kind)
        sources.append((param, kind, value, param, strict))
    if so is not None and so.json_object:
        sources.append(
            (
                "structured_outputs.json_object",
                "json_object",
                None,
                "structured_outputs.json_object",
                grammar_adapter.strict_closing("json_object"),
            )
        )
    return sources


def plan_chat(req: ChatCompletionRequest, registry: SchemaRegistry, tenant: str) -> ConstraintPlan:
    sources = _format_sources(req)
    tools = check_tools(req.tools) if req.tools is not None else None
    tools_param = "tools"
    if req.schema_id is not None:
        entry = lookup_schema(registry, tenant, req.schema_id)
        if entry.kind == "tools":
            if tools is not None:
                raise bad_request("Give either 'tools' or a tool-set 'schema_id', not both.", "schema_id")
            tools, tools_param = list(entry.payload), "schema_id"
        else:
            kind = entry.kind
            sources.append(
                (
                    "schema_id",
                    kind,
                    entry.payload,
                    f"registered schema '{entry.id}'",
                    grammar_adapter.strict_closing(kind),
                )
            )
    if len(sources) > 1:
        names = ", ".join(s[0].split(".")[0] for s in sources)
        raise bad_request(f"Only one output constraint may be given; got {names}.", sources[1][0])

    choice = req.tool_choice
    if choice is not None and tools is None:
        raise bad_request("'tool_choice' is only allowed when 'tools' are specified.", "tool_choice")
    if isinstance(choice, NamedToolChoice):
        names = {t["function"]["name"] for t in tools or []}
        if choice.function.name not in names:
            raise bad_request(
                f"tool_choice names the function '{choice.function.name}', which is not in 'tools'.", "tool_choice"
            )
    tools_active = tools is not None and choice != "none"

    if tools_active and sources:
        raise bad_request(
            f"'{sources[0][0].split('.')[0]}' cannot be combined with tools unless tool_choice is 'none'.",
            sources[0][0],
        )
    if tools_active:
        assert tools is not None
        if isinstance(choice, NamedToolChoice):
            tool_choice: Any = {"type": "function", "function": {"name": choice.function.name}}
        else:
            tool_choice = choice or "auto"
        parallel = True if req.parallel_tool_calls is None else req.parallel_tool_calls
        strict = True
        return ConstraintPlan(
            kind="tool_calls",
            payload={"tools": tools, "tool_choice": tool_choice, "parallel_tool_calls": parallel},
            param=tools_param,
            label="tools",
            tools=tools,
            parse_tool_calls=True,
            strict=strict,
        )
    plan = _plan_from_sources(sources)
    plan.tools = tools  # tool_choice "none": tools stay in the prompt (same prefix), no tool grammar
    return plan


def plan_completion(req: CompletionRequest, registry: SchemaRegistry, tenant: str) -> ConstraintPlan:
    sources = _format_sources(req)
    if req.schema_id is not None:
        entry = lookup_schema(registry, tenant, req.schema_id)
        if entry.kind == "tools":
            raise bad_request("A tool-set schema_id needs /v1/chat/completions.", "schema_id")
        sources.append(
            (
                "schema_id",
                entry.kind,
                entry.payload,
                f"registered schema '{entry.id}'",
                grammar_adapter.strict_closing(entry.kind),
            )
        )
    if len(sources) > 1:
        names = ", ".join(s[0].split(".")[0] for s in sources)
        raise bad_request(f"Only one output constraint may be given; got {names}.", sources[1][0])
    return _plan_from_sources(sources)


def _plan_from_sources(sources: list[tuple[str, str, Any, str, bool]]) -> ConstraintPlan:
    if not sources:
        return ConstraintPlan()
    param, kind, payload, label, strict = sources[0]
    plan = ConstraintPlan(kind=kind, payload=payload, param=param, label=label, strict=strict)
    try:
        plan.instructions = grammar_adapter.prompt_instructions(kind, payload, param)
    except grammar_adapter.GrammarSpecError as exc:
        raise spec_error(plan, exc) from exc
    return plan


async def compile_plan(plan: ConstraintPlan, service: GrammarService | None, timeout_s: float) -> CompiledConstraint:
    """The compiled constraint for the engine (None for free text); spec errors become 400s."""
    if plan.kind is None:
        return None
    if service is None:
        raise APIError(
            400,
            "Structured output is not available on this server (no grammar service).",
            param=plan.param,
            code="unsupported",
        )
    try:
        return await asyncio.wait_for(grammar_adapter.compile_spec(service, plan.spec), timeout_s)
    except TimeoutError as exc:
        raise bad_request(
            f"Compiling the {plan.label} took longer than {timeout_s:g} s; simplify it.",
            plan.param,
            code="grammar_timeout",
        ) from exc
    except grammar_adapter.GrammarSpecError as exc:
        raise spec_error(plan, exc) from exc
    except grammar_adapter.GrammarServiceBusy as exc:
        raise overloaded(f"The grammar compiler is busy: {exc}") from exc
    except (ValueError, RuntimeError, TypeError) as exc:  # xgrammar raises these for bad input
        raise bad_request(
            f"Invalid {plan.label}: {exc}", plan.param, code=grammar_adapter.error_code(plan.kind)
        ) from exc


def spec_error(plan: ConstraintPlan, exc: grammar_adapter.GrammarSpecError) -> APIError:
    message = exc.message
    if exc.pointer:
        message = f"{message} (at JSON pointer '{exc.pointer}')"
    # a registered schema / an upload names its own field, and so does a constraint given by another
    # field than its kind's usual one (guided_json); otherwise trust the grammar's param
    usual = grammar_adapter.kind_param(plan.kind or "")
    moved = exc.param == usual and plan.param is not None and not plan.param.startswith(usual or "")
    param = plan.param if plan.param in ("schema_id", "schema") or moved else (exc.param or plan.param)
    return bad_request(f"Invalid {plan.label}: {message}", param, code=grammar_adapter.error_code(plan.kind))


# -- tools with an output format: the final answer as one more tool --------------------------------

ANSWER_TOOL = "final_answer"


def answer_tool_name(taken: set[str]) -> str:
    name, n = ANSWER_TOOL, 1
    while name in taken:
        name, n = f"{ANSWER_TOOL}_{n}", n + 1
    return name


def fold_format_into_tools(req: ChatCompletionRequest, schema_param: str = "response_format") -> str | None:
    """Rewrite a request with tools and a JSON format (in place); the answer tool's name, or None."""
    rf = req.response_format
    if not req.tools or not isinstance(rf, (ResponseFormatJsonSchema, ResponseFormatJsonObject)):
        return None
    if req.tool_choice == "none":
        return None  # the tools are only shown; the format applies (as plan_chat does it)
    if req.tool_choice not in (None, "auto"):
        req.response_format = None
        return None
    schema: Any = rf.json_schema.schema if isinstance(rf, ResponseFormatJsonSchema) else {"type": "object"}
    strict = rf.json_schema.strict if isinstance(rf, ResponseFormatJsonSchema) else None
    if not isinstance(schema, dict) or schema.get("type") != "object":
        raise bad_request(
            "With tools, the output format must describe a JSON object (it becomes the final answer's arguments).",
            schema_param,
        )
    name = answer_tool_name({t.function.name for t in req.tools})
    # listed first: a small model leans towards the first tool, and answering is the usual end
    req.tools = [
        ToolDefinition(
            function=FunctionDefinition(
                name=name,
                description="Give the final answer to the user (once tool results are in).",
                parameters=schema,
                strict=strict,
            )
        )
    ] + list(req.tools)
    req.tool_choice, req.parallel_tool_calls, req.response_format = "required", False, None
    return name
