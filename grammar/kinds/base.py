"""`ConstraintKind`: everything Jumpgate knows about one way of shaping the output.

A request's constraint is a `GrammarSpec` (kind name + payload + strict). What differs between
kinds -- which request parameter a spec comes from, how its payload is checked, canonicalized for
the cache key, compiled, described in the prompt, and whether the runtime's strict completion
guard applies -- is one `ConstraintKind` subclass per kind, one module each under grammar/kinds/.
Every other module looks a kind up (`grammar.kinds.kind_for(name)`) instead of branching on its
name.

Adding a kind = adding one module, grammar/kinds/<name>.py, with a `ConstraintKind` subclass
(set `name`, `param`, `what`, `error_code`; implement `validate` and `compile`; override the
defaults that differ) and its instance `KIND`; then list that instance in `KINDS`
(grammar/kinds/__init__.py) and give an example payload in tests/grammar/test_grammar_kinds.py, which
round-trips every registered kind. Nothing else in grammar/ changes; the gateway accepts the kind
wherever a request field is mapped to it (`grammar_adapter.make_spec`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar, Protocol

import xgrammar as xgr

from grammar.schema.canonical import canonical_data


class SpecLike(Protocol):
    """The fields of a GrammarSpec a kind reads (kinds never import grammar/spec.py)."""

    kind: str
    payload: Any
    strict: bool

    @property
    def param(self) -> str: ...


class ConstraintKind(ABC):
    name: ClassVar[str]  # GrammarSpec.kind
    param: ClassVar[str]  # the request parameter a spec comes from: where a refusal points
    what: ClassVar[str]  # how messages name a spec of this kind ("JSON schema")
    error_code: ClassVar[str]  # the OpenAI-style error code of a refused spec
    # Whether a strict request of this kind runs under the runtime's completion guard
    # (budget-aware closing, loop breaking): only for grammars whose values can be closed early.
    strict_closing: ClassVar[bool] = False

    def spec_fields(self, payload: Any, strict: bool) -> tuple[Any, bool]:
        """The (payload, strict) a spec of this kind holds for a request's payload and strictness.
        By default `strict` does not change the grammar, so it is fixed (one cache key)."""
        return payload, True

    @abstractmethod
    def validate(self, spec: SpecLike) -> None:
        """Raise GrammarSpecError (param + JSON pointer of the bad part) for a payload that cannot
        be compiled; runs before `compile`, off the event loop."""

    def canonical_payload(self, payload: Any) -> Any:
        """The payload in one form per meaning (the cache key is the hash of its JSON)."""
        return canonical_data(payload)

    @abstractmethod
    def compile(self, compiler: xgr.GrammarCompiler, spec: SpecLike) -> xgr.CompiledGrammar:
        """The compiled grammar of a validated spec; xgrammar's errors may propagate (the caller
        names them with `what`)."""

    def prompt_instructions(self, payload: Any) -> str | None:
        """Text for the prompt's system block that tells the model what to write (None: none).
        The grammar enforces the shape; the hint helps a small model choose sensible values."""
        return None
