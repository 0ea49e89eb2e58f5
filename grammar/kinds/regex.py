"""regex: text matching a regular expression (Jumpgate's `regex` request parameter)."""

from __future__ import annotations

import xgrammar as xgr

from grammar.kinds.base import ConstraintKind, SpecLike
from grammar.validation.regex_check import validate_regex, xgrammar_regex


class RegexKind(ConstraintKind):
    name = "regex"
    param = "regex"
    what = "regex"
    error_code = "invalid_regex"
    # closing follows the shortest completion the plan finds from the matcher's state (none found
    # within the plan's cap: the guard never closes, as without it)
    strict_closing = True

    def validate(self, spec: SpecLike) -> None:
        validate_regex(spec.payload, param=spec.param)

    def compile(self, compiler: xgr.GrammarCompiler, spec: SpecLike) -> xgr.CompiledGrammar:
        return compiler.compile_regex(xgrammar_regex(spec.payload))


KIND = RegexKind()
