"""structural_tag: an XGrammar structural tag as given (`response_format: {"type": "structural_tag"}`).

Both forms vLLM and SGLang accept: the current one (`{"format": {...}}`, XGrammar's format tree)
and the legacy one (`structures` of begin / JSON schema / end, plus `triggers`), which is converted
to the current one so both share a cache key. The schemas inside are masked by XGrammar alone:
no value checks, rollback or fidelity report, as in the peers.
"""

from __future__ import annotations

from typing import Any

import xgrammar as xgr

from grammar.errors import GrammarSpecError
from grammar.kinds.base import ConstraintKind, SpecLike


def _current_form(payload: Any) -> Any:
    """The legacy form rewritten as the current one (anything else as given, for validate)."""
    if not isinstance(payload, dict) or "format" in payload or "structures" not in payload:
        return payload
    structures, triggers = payload.get("structures"), payload.get("triggers")
    if not isinstance(structures, list) or not isinstance(triggers, list):
        return payload  # refused by validate, with its message
    try:
        items = [xgr.StructuralTagItem(begin=s["begin"], schema=s.get("schema", {}), end=s["end"]) for s in structures]
        return xgr.StructuralTag.from_legacy_structural_tag(items, triggers).model_dump(mode="json")
    except (KeyError, TypeError, ValueError):
        return payload


class StructuralTagKind(ConstraintKind):
    name = "structural_tag"
    param = "response_format"
    what = "structural tag"
    error_code = "invalid_structural_tag"
    # as for EBNF: closing where the plan finds a completion from the matcher's state
    strict_closing = True

    def spec_fields(self, payload: Any, strict: bool) -> tuple[Any, bool]:
        return _current_form(payload), True

    def validate(self, spec: SpecLike) -> None:
        payload = spec.payload
        if not isinstance(payload, dict) or "format" not in payload:
            raise GrammarSpecError(
                "a structural tag needs 'format' (or the legacy 'structures' of {begin, schema, end} with 'triggers')",
                "",
                spec.param,
            )
        try:
            xgr.StructuralTag.model_validate({**payload, "type": "structural_tag"})
        except ValueError as exc:  # pydantic's ValidationError names the bad field
            first = str(exc).splitlines()
            raise GrammarSpecError(" ".join(line.strip() for line in first[1:3]) or str(exc), "", spec.param) from None

    def compile(self, compiler: xgr.GrammarCompiler, spec: SpecLike) -> xgr.CompiledGrammar:
        return compiler.compile_structural_tag({**spec.payload, "type": "structural_tag"})


KIND = StructuralTagKind()
