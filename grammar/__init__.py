"""Grammars for constrained decoding: specs -> xgrammar compiled grammars -> per-request matchers.

Public API (everything else is internal):

- specs:      GrammarSpec, tokenizer_fingerprint
- kinds:      KINDS, ConstraintKind, kind_for (one module per kind under grammar/kinds/)
- errors:     GrammarError, GrammarSpecError, GrammarCompileTimeout, GrammarServiceBusy
- checks:     validate_spec, validate_json_schema, validate_regex
- compiling:  GrammarService, CompiledGrammarHandle, GrammarServiceStats, build_tokenizer_info
- decoding:   XGrammarMatcher
- tool calls: ToolCallFormat, HERMES_TOOL_CALL_FORMAT, render_tools_prompt,
              tool_calls_grammar_spec, parse_tool_calls, ToolCallStreamParser, ToolCall,
              ContentDelta, ToolCallStartDelta, ToolCallArgumentsDelta
"""

from grammar.errors import GrammarCompileTimeout, GrammarError, GrammarServiceBusy, GrammarSpecError
from grammar.matcher import XGrammarMatcher
from grammar.service import CompiledGrammarHandle, GrammarService, GrammarServiceStats
from grammar.spec import GrammarSpec, tokenizer_fingerprint
from grammar.tokenizer_info import build_tokenizer_info
from grammar.json_schema_check import validate_json_schema
from grammar.kinds import KINDS, ConstraintKind, kind_for
from grammar.kinds.tool_calls.format import (
    HERMES_TOOL_CALL_FORMAT,
    ToolCallFormat,
    get_tool_call_format,
    render_tools_prompt,
)
from grammar.kinds.tool_calls.parser import (
    ContentDelta,
    ToolCall,
    ToolCallArgumentsDelta,
    ToolCallStartDelta,
    ToolCallStreamParser,
    new_tool_call_id,
    parse_tool_calls,
)
from grammar.regex_check import validate_regex
from grammar.tool_spec import tool_calls_grammar_spec
from grammar.validate import validate_spec

__all__ = [
    "GrammarSpec",
    "tokenizer_fingerprint",
    "KINDS",
    "ConstraintKind",
    "kind_for",
    "GrammarError",
    "GrammarSpecError",
    "GrammarCompileTimeout",
    "GrammarServiceBusy",
    "validate_spec",
    "validate_json_schema",
    "validate_regex",
    "GrammarService",
    "CompiledGrammarHandle",
    "GrammarServiceStats",
    "build_tokenizer_info",
    "XGrammarMatcher",
    "ToolCallFormat",
    "HERMES_TOOL_CALL_FORMAT",
    "get_tool_call_format",
    "render_tools_prompt",
    "tool_calls_grammar_spec",
    "parse_tool_calls",
    "ToolCallStreamParser",
    "ToolCall",
    "ContentDelta",
    "ToolCallStartDelta",
    "ToolCallArgumentsDelta",
    "new_tool_call_id",
]
