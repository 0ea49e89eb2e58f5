"""Grammars for constrained decoding: specs -> xgrammar compiled grammars -> per-request matchers.

Public API (everything else is internal):

- specs:      GrammarSpec, tokenizer_fingerprint
- kinds:      KINDS, ConstraintKind, kind_for (one module per kind under grammar/kinds/)
- errors:     GrammarError, GrammarSpecError, GrammarCompileTimeout, GrammarCompileMemoryError,
              GrammarServiceBusy
- checks:     validate_spec, validate_json_schema, validate_regex
- compiling:  GrammarService, CompiledGrammarHandle, GrammarServiceStats, build_tokenizer_info,
              output_markers
- decoding:   XGrammarMatcher
- tool calls: ToolCallFormat, HERMES_TOOL_CALL_FORMAT, render_tools_prompt, get_tool_call_format,
              tool_call_format_names, detect_tool_call_format, detect_reasoning_format, stream_parser,
              tool_calls_grammar_spec, parse_tool_calls, ToolCallStreamParser, ToolCall,
              ContentDelta, ToolCallStartDelta, ToolCallArgumentsDelta
"""

# Names are loaded on first use (PEP 562), so importing a light submodule such as grammar.settings
# (the CLI does, for `jumpgate serve --help`) does not pull in xgrammar and torch.
_EXPORTS = {
    "GrammarCompileMemoryError": "grammar.errors",
    "GrammarCompileTimeout": "grammar.errors",
    "GrammarError": "grammar.errors",
    "GrammarServiceBusy": "grammar.errors",
    "GrammarSpecError": "grammar.errors",
    "XGrammarMatcher": "grammar.engines.xgrammar.matcher",
    "CompiledGrammarHandle": "grammar.service.service",
    "GrammarService": "grammar.service.service",
    "GrammarServiceStats": "grammar.service.stats",
    "GrammarSpec": "grammar.spec",
    "tokenizer_fingerprint": "grammar.spec",
    "build_tokenizer_info": "grammar.engines.xgrammar.tokenizer",
    "output_markers": "grammar.engines.xgrammar.tokenizer",
    "validate_json_schema": "grammar.validation.json_schema_check",
    "KINDS": "grammar.kinds",
    "ConstraintKind": "grammar.kinds",
    "kind_for": "grammar.kinds",
    "HERMES_TOOL_CALL_FORMAT": "grammar.kinds.tool_calls.format",
    "ToolCallFormat": "grammar.kinds.tool_calls.format",
    "get_tool_call_format": "grammar.kinds.tool_calls.format",
    "tool_call_format_names": "grammar.kinds.tool_calls.format",
    "detect_tool_call_format": "grammar.kinds.tool_calls.detect",
    "detect_reasoning_format": "grammar.kinds.tool_calls.detect",
    "stream_parser": "grammar.kinds.tool_calls.parser",
    "render_tools_prompt": "grammar.kinds.tool_calls.format",
    "ContentDelta": "grammar.kinds.tool_calls.step_parser",
    "ToolCall": "grammar.kinds.tool_calls.step_parser",
    "ToolCallArgumentsDelta": "grammar.kinds.tool_calls.step_parser",
    "ToolCallStartDelta": "grammar.kinds.tool_calls.step_parser",
    "ToolCallStreamParser": "grammar.kinds.tool_calls.parser",
    "new_tool_call_id": "grammar.kinds.tool_calls.step_parser",
    "parse_tool_calls": "grammar.kinds.tool_calls.parser",
    "validate_regex": "grammar.validation.regex_check",
    "tool_calls_grammar_spec": "grammar.tool_spec",
    "validate_spec": "grammar.validate",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'grammar' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
