"""A model family's tool-call format as xgrammar describes it (`get_model_structural_tag`).

One `TagToolCallFormat` per xgrammar format name (llama, qwen_3, qwen_3_coder, harmony, kimi, ...).
The grammar is xgrammar's structural tag, with each JSON-arguments content replaced by Jumpgate's
compact JSON grammar of the tool's parameters (the same grammar the Hermes format uses, so value
checks, check-and-roll-back and the fidelity report see each tool's arguments schema as before).
The parser's `TagShape` is read from the same tag, built for a placeholder tool, so grammar and
parser come from one description and cannot drift.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from grammar.engines.xgrammar.schema import compact_json_schema_ebnf
from grammar.schema.canonical import canonical_json, canonical_tool

PLACEHOLDER = "JGTOOLNAMEJG"  # a tool name the walk below recognises in xgrammar's markers
NAME_RE = r"[A-Za-z0-9_.\-]{1,64}"
XML_STYLES = ("qwen_xml", "glm_xml", "gemma")  # arguments written as markup, not JSON


def arguments_schema(function: dict) -> dict:
    """A tool's parameters schema; a missing one (or one without a type) means any object."""
    params = function.get("parameters")
    if not params:
        return {"type": "object"}
    if "type" not in params:
        return {"type": "object", **params}
    return params


@dataclass(frozen=True)
class CallShape:
    """One way a call is written: `head_prefix NAME head_suffix [arg_prefix] ARGS end`."""

    head_prefix: str
    head_suffix: str
    arg_prefix: str  # a regex between the header and the arguments ("" for most formats)
    style: str  # json | qwen_xml | glm_xml | gemma
    ends: tuple[str, ...]

    @property
    def head_re(self) -> re.Pattern[str]:
        return _head_re(self.head_prefix, self.head_suffix, self.arg_prefix)


@lru_cache(maxsize=256)
def _head_re(prefix: str, suffix: str, arg_prefix: str) -> re.Pattern[str]:
    return re.compile(re.escape(prefix) + _name_group("name", suffix + arg_prefix) + re.escape(suffix) + arg_prefix)


def _name_group(group: str, after: str) -> str:
    """The tool name; with nothing after it (glm, gemma) it ends where a non-name character shows,
    so a name still streaming is not cut short."""
    # a space after the name is read too (harmony's own template writes `NAME <|constrain|>`)
    return f"(?P<{group}>{NAME_RE})" + (" ?" if after else r"(?=[^A-Za-z0-9_.\-])")


@dataclass(frozen=True)
class TagShape:
    """What the parser needs, read from xgrammar's tag for a placeholder tool."""

    calls: tuple[CallShape, ...]
    markers: tuple[str, ...]  # wrappers and separators around calls: dropped
    channels: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (begin, ends) of plain-text sections
    reasoning: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (begin, ends) of reasoning sections
    group: tuple[str, str] = ("", "")  # what wraps a turn's calls (deepseek, kimi)
    separator: str = ""  # between two calls


def _walk(node: Any, shape: dict[str, list]) -> None:
    """Collect call shapes, markers and text channels from a structural-tag format tree."""
    if isinstance(node, list):
        for item in node:
            _walk(item, shape)
        return
    if not isinstance(node, dict):
        return
    kind = node.get("type")
    if kind == "tag":
        begin, content, end = node["begin"], node["content"], node["end"]
        ends = tuple(end) if isinstance(end, list) else (end,)
        args = _arguments_of(content)
        if PLACEHOLDER in begin and args is not None:
            prefix, suffix = begin.split(PLACEHOLDER, 1)
            arg_prefix, style = args
            shape["calls"].append(CallShape(prefix, suffix, arg_prefix, style, ends))
            return
        if content.get("type") == "any_text":
            shape["channels"].append((begin, ends))
            return
        shape["markers"] += [m for m in (begin, *ends) if m]
        shape["group"].append((begin, ends[0]))
        _walk(content, shape)
        return
    if kind == "tags_with_separator" and node.get("separator"):
        shape["markers"].append(node["separator"])
        shape["separator"].append(node["separator"])
    if kind == "const_string" and node.get("value"):
        shape["markers"].append(node["value"])
    for key in ("format", "content", "elements", "tags"):
        if key in node:
            _walk(node[key], shape)


def _arguments_of(content: dict) -> tuple[str, str] | None:
    """(regex before the arguments, arguments style) of a call tag's content; None: not a call."""
    if content.get("type") == "json_schema":
        return "", content.get("style", "json")
    if content.get("type") == "sequence":
        parts: list[str] = []
        for element in content["elements"]:
            if element.get("type") == "json_schema":
                return "".join(parts), element.get("style", "json")
            if element.get("type") == "const_string":
                parts.append(re.escape(element["value"]))
            elif element.get("type") == "regex":
                parts.append(f"(?:{element['pattern']})")
            else:
                return None
    return None


def xgrammar_tag(name: str, tools: list[dict], tool_choice: Any, parallel: bool) -> dict:
    if name in HAND_WRITTEN:
        return HAND_WRITTEN[name](tools, tool_choice, parallel)
    import xgrammar as xgr  # heavy: only where a grammar is built

    tag = xgr.get_model_structural_tag(
        name, tools=tools, tool_choice=tool_choice, reasoning="disabled", parallel_tool_calls=parallel
    )
    return tag.model_dump(mode="json", exclude_none=True)


def mistral_tag(tools: list[dict], tool_choice: Any, parallel: bool) -> dict:
    """Mistral (v11+ tokenizers): `[TOOL_CALLS]name[ARGS]{...}` per call, in xgrammar's tag form
    (xgrammar 0.2.9 has no mistral entry)."""

    def tag(tool: dict) -> dict:
        function = tool["function"]
        schema = function.get("parameters") if function.get("strict") is not False else None
        return {
            "type": "tag",
            "begin": f"[TOOL_CALLS]{function['name']}[ARGS]",
            "content": {"type": "json_schema", "json_schema": schema or True, "style": "json"},
            "end": "",
        }

    if isinstance(tool_choice, dict):
        chosen = [t for t in tools if t["function"]["name"] == tool_choice["function"]["name"]]
        return {"type": "structural_tag", "format": tag(chosen[0])}
    return {
        "type": "structural_tag",
        "format": {
            "type": "triggered_tags",
            "triggers": ["[TOOL_CALLS]"],
            "tags": [tag(t) for t in tools],
            "at_least_one": tool_choice == "required",
            "stop_after_first": not parallel,
            "excludes": [],
        },
    }


HAND_WRITTEN = {"mistral": mistral_tag}


# xgrammar 0.2.9's model formats whose argument styles the parser reads (json, qwen_xml, glm_xml,
# gemma), plus mistral; its kimi_k3, deepseek_v3_2, deepseek_v4, deepseek_v4_1, minimax and
# minimax_m3 (other markup styles) and cohere (another tag layout) are not offered yet
SUPPORTED_FORMATS = (
    "qwen_3",
    "llama",
    "qwen_3_coder",
    "qwen_3_5",
    "mimo",
    "harmony",
    "deepseek_r1",
    "deepseek_v3_1",
    "kimi",
    "glm_4_7",
    "gemma_4",
    "exaone",
    "mistral",
)


def tag_format_names() -> list[str]:
    return list(SUPPORTED_FORMATS)


@lru_cache(maxsize=64)
def get_tag_format(name: str) -> TagToolCallFormat | None:
    return TagToolCallFormat(name) if name in tag_format_names() else None


@lru_cache(maxsize=64)
def tag_shape(name: str) -> TagShape:
    placeholder = [{"type": "function", "function": {"name": PLACEHOLDER, "parameters": {"type": "object"}}}]
    shape: dict[str, list] = {"calls": [], "markers": [], "channels": [], "group": [], "separator": []}
    _walk(xgrammar_tag(name, placeholder, "auto", True)["format"], shape)
    channels = tuple(shape["channels"])
    # harmony: xgrammar's tag (reasoning disabled) names only the final channel; the analysis
    # channel is written the same way, and read as reasoning
    reasoning = tuple((b.replace("final", "analysis"), ends) for b, ends in channels if "final" in b)
    markers = tuple(dict.fromkeys(m for m in shape["markers"]))
    group = shape["group"][0] if shape["group"] else ("", "")
    separator = shape["separator"][0] if shape["separator"] else ""
    return TagShape(tuple(dict.fromkeys(shape["calls"])), markers, channels, reasoning, group, separator)


def _common_suffix(texts: list[str]) -> str:
    out = texts[0]
    for t in texts[1:]:
        while not t.endswith(out):
            out = out[1:]
    return out


@dataclass(frozen=True)
class TagToolCallFormat:
    """A tool-call format from xgrammar's registry of model formats."""

    name: str

    @property
    def shape(self) -> TagShape:
        return tag_shape(self.name)

    @property
    def json_arguments(self) -> bool:
        return all(c.style == "json" for c in self.shape.calls)

    value_checked = json_arguments  # markup arguments get the grammar's mask only

    @property
    def call_begin(self) -> str:
        """Where each call's arguments JSON starts, for the value check: the text every call's
        header ends with (None-like "" for formats whose arguments are markup)."""
        if not self.json_arguments:
            return ""
        calls = self.shape.calls
        if any(c.arg_prefix and not _literal(c.arg_prefix) for c in calls):  # kimi: the last literal
            return _common_suffix([_literal_tail(c.arg_prefix) for c in calls])
        return _common_suffix([c.head_suffix + _unescape(c.arg_prefix) for c in calls])

    @property
    def triggers(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(c.head_prefix for c in self.shape.calls))

    def structural_tag(self, tools: list[dict], tool_choice: Any, parallel_tool_calls: bool) -> dict:
        """xgrammar's tag with each JSON arguments content replaced by the compact JSON grammar."""
        if tool_choice == "none" or not tools:
            return {"type": "structural_tag", "format": {"type": "any_text", "excludes": []}}
        functions = {t["function"]["name"]: t["function"] for t in tools}
        # a named function is exactly one call of it, as in the hermes format (xgrammar's harmony
        # tag otherwise allows several)
        parallel = parallel_tool_calls and not isinstance(tool_choice, dict)
        tag = xgrammar_tag(self.name, tools, tool_choice, parallel)
        tag["format"] = _ends_at_stop(_compact_arguments(tag["format"], functions, self.shape.calls))
        if tool_choice == "required" or isinstance(tool_choice, dict):  # harmony's tags let both end with no call
            while tag["format"].get("type") == "optional":
                tag["format"] = tag["format"]["content"]
            if tag["format"].get("type") in ("tags_with_separator", "triggered_tags"):
                tag["format"]["at_least_one"] = True
        return tag

    def header_re(self) -> re.Pattern[bytes]:
        """Bytes regex of a call header (name captured), ending where the arguments JSON starts."""
        alts = [
            re.escape(c.head_prefix)
            + _name_group(f"n{i}", c.head_suffix + c.arg_prefix)
            + re.escape(c.head_suffix)
            + c.arg_prefix
            for i, c in enumerate(self.shape.calls)
        ]
        return re.compile("|".join(f"(?:{a})" for a in alts).encode())

    def render_tools_prompt(self, tools: list[dict]) -> str:
        """Fallback tools text for a template that takes no `tools` (canonical JSON)."""
        lines = "\n".join(canonical_json(canonical_tool(t)) for t in tools)
        example = self.render_call("<function-name>", "<arguments-json-object>")
        return (
            "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            f"You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{lines}\n"
            f"</tools>\n\nTo call a function, write exactly:\n{example}"
        )

    def render_call(self, name: str, arguments: str) -> str:
        """One past call as the model writes it (templates that take `tool_calls` render their own)."""
        call = self.shape.calls[0]
        body = arguments if call.style == "json" else _xml_arguments(call.style, arguments)
        return f"{call.head_prefix}{name}{call.head_suffix}{_unescape(call.arg_prefix)}{body}{call.ends[0]}"

    def render_calls(self, calls) -> str:
        """A turn's calls [(name, arguments JSON)]: the group's wrapper, calls by the separator."""
        shape = self.shape
        body = shape.separator.join(self.render_call(n, a) for n, a in calls)
        return f"{shape.group[0]}{body}{shape.group[1]}"

    def render_tool_response(self, content: str) -> str:
        return f"<tool_response>\n{content}\n</tool_response>"


def _literal(pattern: str) -> bool:
    return re.escape(_unescape(pattern)) == pattern


def _unescape(pattern: str) -> str:
    """A regex that is an escaped literal, back to its text; kimi's call index becomes 0."""
    text = pattern.replace(r"(?:\d+)", "0")
    return re.sub(r"\\(.)", r"\1", text)


def _literal_tail(pattern: str) -> str:
    """The literal text a pattern ends with (after its last group)."""
    return _unescape(pattern.rsplit(")", 1)[-1])


def _compact_arguments(node: Any, functions: dict[str, dict], calls: tuple[CallShape, ...]) -> Any:
    """Replace JSON-style arguments of each tool's tag with Jumpgate's compact JSON grammar."""
    if isinstance(node, list):
        return [_compact_arguments(n, functions, calls) for n in node]
    if not isinstance(node, dict):
        return node
    if node.get("type") == "tag" and isinstance(node.get("begin"), str):
        name = _tool_name(node["begin"], calls, functions)
        if name is not None:
            return {**node, "content": _with_grammar(node["content"], functions[name])}
    return {
        k: _compact_arguments(v, functions, calls) if k in ("format", "content", "elements", "tags") else v
        for k, v in node.items()
    }


# end markers that are the model's own stop tokens (gpt-oss: `<|return|>` ends its answer, `<|call|>`
# a tool call); the runtime stops on them and never hands them to the grammar
STOP_MARKERS = ("<|return|>", "<|call|>")


def _ends_at_stop(node: Any) -> Any:
    """A message whose end marker is a stop token (harmony's final channel and its calls) may also
    end where it stands: the stop token ends it. Without this a real gpt-oss tokenizer could never
    finish a call (the grammar would want `<|call|>` as text, which the stop token is not), and a
    text answer could never be closed inside max_tokens."""
    if isinstance(node, list):
        return [_ends_at_stop(n) for n in node]
    if not isinstance(node, dict):
        return node
    if node.get("type") == "tag":
        ends = node["end"] if isinstance(node["end"], list) else [node["end"]]
        if any(e in STOP_MARKERS for e in ends) and "" not in ends:
            node = {**node, "end": [*ends, ""]}
    return {k: _ends_at_stop(v) if k in ("format", "content", "elements", "tags") else v for k, v in node.items()}


def _tool_name(begin: str, calls: tuple[CallShape, ...], functions: dict[str, dict]) -> str | None:
    for call in calls:
        if begin.startswith(call.head_prefix) and begin.endswith(call.head_suffix):
            name = begin[len(call.head_prefix) : len(begin) - len(call.head_suffix)]
            if name in functions:
                return name
    return None


def _with_grammar(content: dict, function: dict) -> dict:
    def grammar(node: dict) -> dict:
        if node.get("type") == "json_schema" and node.get("style", "json") == "json":
            strict = function.get("strict") is not False
            return {"type": "grammar", "grammar": compact_json_schema_ebnf(arguments_schema(function), strict=strict)}
        return node

    if content.get("type") == "sequence":
        return {**content, "elements": [grammar(e) for e in content["elements"]]}
    return grammar(content)


def _xml_arguments(style: str, arguments: str) -> str:
    """JSON arguments written in a markup style (past calls in the fallback rendering)."""
    try:
        args = json.loads(arguments)
    except ValueError:
        return arguments
    if not isinstance(args, dict):
        return arguments

    def text(v: Any) -> str:
        return v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)

    if style == "qwen_xml":
        return "".join(f"<parameter={k}>\n{text(v)}\n</parameter>\n" for k, v in args.items())
    if style == "glm_xml":
        return "".join(f"<arg_key>{k}</arg_key><arg_value>{text(v)}</arg_value>" for k, v in args.items())
    return gemma_value(args)


def gemma_value(v: Any) -> str:
    if isinstance(v, str):
        return f'<|"|>{v}<|"|>'
    if isinstance(v, dict):
        return "{" + ",".join(f"{k}:{gemma_value(x)}" for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + ",".join(gemma_value(x) for x in v) + "]"
    return json.dumps(v)
