"""Per-request llguidance state for the engine (implements runtime.constraint.TokenMatcher).

`LLGuidanceGrammar` is the compiled constraint: one matcher at the start state, validated once,
whose deep copies are the requests' matchers (a copy shares the compiled grammar and costs
microseconds). Jump-forward uses llguidance's own forced tokens.

Strict completeness (budget-aware closing, loop breaking) needs a completion planner, which
exists only for xgrammar (grammar/closing.py): `supports_strict` is False, so a strict request on
this engine keeps the exact mask but decodes without the closing guard (a value cut by
max_tokens is reported as truncated, never passed off as valid).

The value check (grammar/value_check.py: no repeated names or unique items) rides along as it
does on xgrammar's matcher.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace
from typing import Any

import llguidance
import llguidance.hf

from grammar.errors import GrammarSpecError
from grammar.token_mask import allow_only, row_address
from grammar.value_check import ValueCheck, without_repeats


class LLGuidanceTokenizer:
    """The llguidance view of the model's tokenizer, built on first use (about 1.5 s)."""

    def __init__(self, hf_tokenizer: Any, vocab_size: int, stop_token_ids: list[int]) -> None:
        self._args = (hf_tokenizer, vocab_size, list(stop_token_ids))
        self._built: llguidance.LLTokenizer | None = None
        self._lock = threading.Lock()

    def get(self) -> llguidance.LLTokenizer:
        with self._lock:
            if self._built is None:
                hf_tokenizer, vocab_size, stop_ids = self._args
                self._built = llguidance.hf.from_tokenizer(hf_tokenizer, n_vocab=vocab_size, eos_token=stop_ids)
            return self._built


def compile_llguidance(tokenizer: llguidance.LLTokenizer, grammar: str, what: str, param: str | None):
    """The start-state matcher of `grammar`; GrammarSpecError when llguidance refuses it."""
    failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, tokenizer)
    if failed:
        raise GrammarSpecError(f"{what} cannot be compiled by llguidance: {'; '.join(messages)}", "", param)
    matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
    if matcher.is_error():
        raise GrammarSpecError(f"{what} cannot be compiled by llguidance: {matcher.get_error()}", "", param)
    return matcher


@dataclass(frozen=True, eq=False)
class LLGuidanceHandle:
    """A grammar compiled by llguidance, shared by every request with the same spec (a
    CompiledConstraint, like grammar.service.CompiledGrammarHandle)."""

    key: str
    kind: str
    grammar: str  # llguidance's grammar text (what the size estimate is based on)
    start: Any = field(repr=False)  # llguidance.LLMatcher at the start state
    stop_ids: frozenset[int] = field(repr=False)
    fidelity: Any = None  # grammar.fidelity.FidelityReport
    engine: str = "llguidance"
    value_check: Any = field(default=None, repr=False)  # grammar.value_check.ValueCheckVocab (JSON kinds)
    navigator: Any = field(default=None, repr=False)  # grammar.value_rules.SchemaNavigator

    def new_matcher(self) -> "LLGuidanceMatcher":
        values = ValueCheck(self.value_check, self.navigator) if self.value_check is not None else None
        return LLGuidanceMatcher(self.start, self.stop_ids, values)

    def without_value_check(self) -> "LLGuidanceHandle":
        """The same grammar with its matchers not followed by the value check (for comparisons)."""
        return replace(self, value_check=None, navigator=None)

    def min_completion_tokens(self) -> int | None:
        return None  # no completion planner for this engine

    @property
    def memory_size_bytes(self) -> int:
        # llguidance builds its lexer lazily and does not report its size; the grammar text
        # times a generous factor keeps the LRU's byte bound meaningful
        return 64 * 1024 + 16 * len(self.grammar)


class LLGuidanceMatcher:
    __slots__ = ("_matcher", "_write_mask", "_try_consume", "_stop_ids", "_terminated", "values")

    def __init__(self, start: llguidance.LLMatcher, stop_ids: frozenset[int], values: ValueCheck | None = None) -> None:
        self._matcher = start.deep_copy()
        # the two per-token calls, bound once (each lookup through the matcher costs ~0.1 us)
        self._write_mask = self._matcher.unsafe_compute_mask_ptr
        self._try_consume = self._matcher.try_consume_tokens
        self._stop_ids = stop_ids
        self.values = values
        # llguidance reports "stopped" as soon as only EOS may follow; terminated (as xgrammar
        # means it) is the stop token having been accepted.
        self._terminated = False

    def fill_bitmask(self, bitmask, row: int) -> None:
        """Write the allowed next tokens into `bitmask[row]` (int32 CPU tensor, xgrammar layout)."""
        if self._terminated:
            allow_only(bitmask, row, self._stop_ids)
            return
        # straight into the row: the same write as llguidance.torch.fill_next_token_bitmask
        # (same checks, grammar/token_mask.py) without its per-call tensor view
        self._write_mask(*row_address(bitmask, row))
        if self.values is not None:
            self.values.ban(bitmask, row)

    def accept(self, token_id: int) -> bool:
        ok = self._accept(token_id)
        if ok and self.values is not None:
            self.values.accept(int(token_id))
        return ok

    def _accept(self, token_id: int) -> bool:
        token_id = int(token_id)
        if self._terminated:
            return False
        if token_id in self._stop_ids:
            # The stop token is kept here, not given to llguidance: it is allowed exactly when the
            # value is complete, and llguidance 1.9 cannot roll back over a consumed EOS (it drops
            # the token before it too and then refuses everything).
            self._terminated = self._matcher.is_accepting()
            return self._terminated
        # consume_token would put a refusing matcher in a permanent error state; try_consume_tokens
        # consumes the token only if it is allowed (one call, where validate + consume were two)
        return self._try_consume([token_id]) == 1

    def rollback(self, num_tokens: int) -> None:
        if num_tokens <= 0:
            return
        if self.values is not None:
            self.values.rollback(num_tokens)
        if self._terminated:  # the stop token is always the last one accepted
            self._terminated = False
            num_tokens -= 1
        if num_tokens:
            self._matcher.rollback(num_tokens)

    def is_terminated(self) -> bool:
        return self._terminated

    def is_completed(self) -> bool:
        return self._terminated or self._matcher.is_accepting()

    def jump_forward_tokens(self, learn: bool = True) -> list[int]:
        """Tokens llguidance forces from here (its canonical tokenization), not accepted."""
        if self._terminated or self._matcher.is_stopped():
            return []
        forced = [t for t in self._matcher.compute_ff_tokens()]
        kept = self._matcher.validate_tokens(forced) if forced else 0
        draft = forced[:kept]
        cut = next((i for i, t in enumerate(draft) if t in self._stop_ids), len(draft))
        return without_repeats(self.values, draft[:cut])

    # -- strict completeness: not implemented for this engine (see the module docstring) -----

    @property
    def supports_strict(self) -> bool:
        return False

    def completion_plan(self) -> list[int] | None:
        return None

    def completion_bound_after(self, token_id: int) -> int | None:
        return None

    def may_expand(self, token_id: int) -> bool:
        return False

    def closes_value(self, token_id: int) -> bool:
        return False

    def fill_plan_bitmask(self, bitmask, row: int, token_id: int) -> None:
        self.fill_bitmask(bitmask, row)

    def fill_closing_bitmask(self, bitmask, row: int, tight: bool = False, plan_token: int | None = None) -> None:
        self.fill_bitmask(bitmask, row)

    def fill_value_closing_bitmask(self, bitmask, row: int) -> bool:
        return False
