"""json_object: any compact JSON object (`response_format` type json_object); no payload."""

from __future__ import annotations

from typing import Any

import xgrammar as xgr

from grammar.engines.xgrammar.schema import COMPACT_SEPARATORS
from grammar.errors import GrammarSpecError
from grammar.kinds.base import ConstraintKind, SpecLike


class JsonObjectKind(ConstraintKind):
    name = "json_object"
    param = "response_format"
    what = "JSON object grammar"
    error_code = "invalid_schema"
    # `{}` is always near: closing and loop breaking keep a strict object complete
    strict_closing = True

    def spec_fields(self, payload: Any, strict: bool) -> tuple[Any, bool]:
        return None, True

    def validate(self, spec: SpecLike) -> None:
        if spec.payload not in (None, {}):
            raise GrammarSpecError("json_object takes no payload", "", spec.param)

    def compile(self, compiler: xgr.GrammarCompiler, spec: SpecLike) -> xgr.CompiledGrammar:
        # strict_mode would shrink a property-less object to {}
        return compiler.compile_json_schema(
            '{"type":"object"}', any_whitespace=False, separators=COMPACT_SEPARATORS, strict_mode=False
        )

    def prompt_instructions(self, payload: Any) -> str | None:
        return "Respond with only a JSON object."


KIND = JsonObjectKind()
