"""json_schema: compact JSON matching a JSON schema (`response_format` type json_schema)."""

from __future__ import annotations

from typing import Any

import xgrammar as xgr

from grammar.engines.xgrammar.schema import compact_json_grammar
from grammar.kinds.base import ConstraintKind, SpecLike
from grammar.schema.canonical import canonical_json, canonical_schema
from grammar.validation.json_schema_check import validate_json_schema


class JsonSchemaKind(ConstraintKind):
    """`strict`: no properties beyond the declared ones wherever a schema declares `properties`,
    as OpenAI's strict mode does; without it JSON Schema's open-object default applies."""

    name = "json_schema"
    param = "response_format"
    what = "JSON schema"
    error_code = "invalid_schema"
    strict_closing = True

    def spec_fields(self, payload: Any, strict: bool) -> tuple[Any, bool]:
        return payload, strict

    def validate(self, spec: SpecLike) -> None:
        validate_json_schema(spec.payload, param=spec.param, strict=spec.strict)

    def canonical_payload(self, payload: Any) -> Any:
        return canonical_schema(payload)

    def compile(self, compiler: xgr.GrammarCompiler, spec: SpecLike) -> xgr.CompiledGrammar:
        return compiler.compile_grammar(compact_json_grammar(spec.payload, strict=spec.strict))

    def prompt_instructions(self, payload: Any) -> str | None:
        # canonical JSON, so that equal schemas give equal prompt prefixes (KV-cache reuse)
        return "Respond with only a JSON value that conforms to this JSON schema:\n" + canonical_json(
            canonical_schema(payload)
        )


KIND = JsonSchemaKind()
