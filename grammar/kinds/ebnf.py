"""ebnf: text matching an EBNF grammar in xgrammar's dialect (Jumpgate's `ebnf` parameter)."""

from __future__ import annotations

import xgrammar as xgr

from grammar.errors import GrammarSpecError
from grammar.kinds.base import ConstraintKind, SpecLike


class EbnfKind(ConstraintKind):
    name = "ebnf"
    param = "ebnf"
    what = "EBNF grammar"
    error_code = "invalid_grammar"
    # as for regex: closing where the plan finds a completion from the matcher's state
    strict_closing = True

    def validate(self, spec: SpecLike) -> None:
        # xgrammar checks the grammar itself when compiling (its message names the bad rule)
        if not isinstance(spec.payload, str) or not spec.payload.strip():
            raise GrammarSpecError("ebnf grammar must be a non-empty string", "", spec.param)

    def compile(self, compiler: xgr.GrammarCompiler, spec: SpecLike) -> xgr.CompiledGrammar:
        return compiler.compile_grammar(spec.payload)


KIND = EbnfKind()
