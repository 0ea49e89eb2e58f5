"""choice: exactly one of a list of strings (vLLM's `guided_choice` / `structured_outputs.choice`)."""

from __future__ import annotations

from typing import Any

import xgrammar as xgr

from grammar.errors import GrammarSpecError
from grammar.kinds.base import ConstraintKind, SpecLike

MAX_CHOICES = 4096
MAX_CHOICE_CHARS = 4096
PROMPT_CHOICES = 32  # the prompt lists this many; the mask holds every one


class ChoiceKind(ConstraintKind):
    name = "choice"
    param = "guided_choice"
    what = "choice list"
    error_code = "invalid_choice"
    # the shortest completion from any state is the rest of a listed string: always closable
    strict_closing = True

    def validate(self, spec: SpecLike) -> None:
        choices = spec.payload
        if not isinstance(choices, list) or not choices:
            raise GrammarSpecError("a choice list must be a non-empty list of strings", "", spec.param)
        if len(choices) > MAX_CHOICES:
            raise GrammarSpecError(f"a choice list may hold at most {MAX_CHOICES} strings", "", spec.param)
        for i, choice in enumerate(choices):
            if not isinstance(choice, str) or not choice:
                raise GrammarSpecError("every choice must be a non-empty string", f"/{i}", spec.param)
            if len(choice) > MAX_CHOICE_CHARS:
                raise GrammarSpecError(f"a choice may hold at most {MAX_CHOICE_CHARS} characters", f"/{i}", spec.param)

    def canonical_payload(self, payload: Any) -> Any:
        # order and repeats do not change what the mask admits: one cache key per set
        return sorted(set(payload)) if isinstance(payload, list) else payload

    def compile(self, compiler: xgr.GrammarCompiler, spec: SpecLike) -> xgr.CompiledGrammar:
        elements = [{"type": "const_string", "value": c} for c in sorted(set(spec.payload))]
        fmt = elements[0] if len(elements) == 1 else {"type": "or", "elements": elements}
        return compiler.compile_structural_tag({"type": "structural_tag", "format": fmt})

    def prompt_instructions(self, payload: Any) -> str | None:
        shown = ", ".join(f'"{c}"' for c in payload[:PROMPT_CHOICES])
        more = f" (or one of {len(payload) - PROMPT_CHOICES} more)" if len(payload) > PROMPT_CHOICES else ""
        return f"Answer with exactly one of: {shown}{more}. Write nothing else."


KIND = ChoiceKind()
