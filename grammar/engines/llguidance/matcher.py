"""Per-request llguidance state for the engine (implements runtime.constraint.TokenMatcher).

`LLGuidanceHandle` is the compiled constraint: one matcher at the start state, validated once,
whose deep copies are the requests' matchers (a copy shares the compiled grammar and costs
microseconds). Jump-forward uses llguidance's own forced tokens.

Strict completeness (budget-aware closing, loop breaking) is the same as on xgrammar: the
strict methods are grammar/checks/strict.py's, planning with grammar/checks/closing.py's planner through
`LLGuidancePlanMatcher`, its `PlanMatcher` over an `llguidance.LLMatcher` (forks are deep copies,
masks are written in place, forced text is llguidance's forced bytes in the tokenizer's own
encoding, as for xgrammar). llguidance shows nothing of its parser state, so the planner tells
states apart by their masks alone; a counted repetition whose states share a mask (`[0-9]{5}`) is
still walked, one new candidate per state. `LLGuidanceHandle.min_completion_tokens` is the plan's
length from the start state, so a strict budget below it is refused at submission as it is for
xgrammar. The stop token is never handed to llguidance, by the matcher or the planner (llguidance
1.9 cannot roll back over it).

The value check (grammar/checks/value_check.py: no repeated names or unique items) rides along as it
does on xgrammar's matcher, plans included.

Masks: written by llguidance straight into the bitmask row; along the grammar's forced path from
the start (the same states in every request), copied from a `ForcedPath` the grammar's matchers
share, since llguidance would compute those, its costliest masks, afresh for each request.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field, replace
from typing import Any

import llguidance
import numpy as np

from grammar.checks.closing import ClosingVocab
from grammar.checks.plan_names import NameHint, NameTail, name_hint
from grammar.checks.plan_state import exact_key
from grammar.checks.rollback import RollbackCheck, RollbackRules
from grammar.checks.strict import StrictMethods
from grammar.checks.value_check import ValueCheck, without_repeats
from grammar.engines.draft_split import Encode
from grammar.engines.token_mask import allow_only, row_address
from grammar.errors import GrammarSpecError

# How deep a grammar's forced path is kept (ForcedPath): a schema's opening (`{"name":"`) takes a
# few tokens; a long constant prefix is computed past this depth as any other position.
FORCED_DEPTH_KEPT = 32


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
    CompiledConstraint, like grammar.service.service.CompiledGrammarHandle)."""

    key: str
    kind: str
    grammar: str  # llguidance's grammar text (what the size estimate is based on)
    start: Any = field(repr=False)  # llguidance.LLMatcher at the start state
    stop_ids: frozenset[int] = field(repr=False)
    fidelity: Any = None  # grammar.validation.fidelity.FidelityReport
    engine: str = "llguidance"
    value_check: Any = field(default=None, repr=False)  # grammar.checks.value_check.ValueCheckVocab (JSON kinds)
    rollback_rules: RollbackRules | None = field(default=None, repr=False)  # check-and-roll-back (None: none)
    navigator: Any = field(default=None, repr=False)  # grammar.checks.value_rules.SchemaNavigator
    closing: ClosingVocab | None = field(default=None, repr=False)  # strict planning (None: none)
    encode: Encode | None = field(default=None, repr=False)  # the tokenizer's encoding (planning's forced text)
    _memo: dict = field(default_factory=dict, repr=False)

    def new_matcher(self) -> LLGuidanceMatcher:
        values = ValueCheck(self.value_check, self.navigator) if self.value_check is not None else None
        rechecks = RollbackCheck(self.rollback_rules) if self.rollback_rules is not None else None
        return LLGuidanceMatcher(
            self.start,
            self.stop_ids,
            values,
            self.closing,
            self.encode,
            rechecks,
            self._memo.setdefault("forced_path", ForcedPath()),
            name_hint(self._memo, self.navigator, self.value_check, self.closing),
        )

    @property
    def forced_path(self) -> ForcedPath | None:
        """The forced-text path its matchers share (None until the first matcher is made)."""
        return self._memo.get("forced_path")

    def without_value_check(self) -> LLGuidanceHandle:
        """The same grammar with its matchers not followed by the value check (for comparisons)."""
        return replace(self, value_check=None, navigator=None, _memo={})

    def min_completion_tokens(self) -> int | None:
        """Tokens of the smallest output the grammar allows (the plan from the start state,
        computed once per grammar; None without a closing vocabulary or a plan)."""
        if "min_tokens" not in self._memo:
            self._memo["min_tokens"] = self.new_matcher().completion_bound()
        return self._memo["min_tokens"]

    @property
    def memory_size_bytes(self) -> int:
        # llguidance builds its lexer lazily and does not report its size; the grammar text
        # times a generous factor keeps the LRU's byte bound meaningful, and the forced path
        # keeps at most FORCED_DEPTH_KEPT mask rows
        rows = FORCED_DEPTH_KEPT * 4 * ((self.closing.vocab_size + 31) // 32) if self.closing is not None else 0
        return 64 * 1024 + 16 * len(self.grammar) + rows


def _no_name() -> None:
    return None


class LLGuidancePlanMatcher:
    """grammar/checks/closing.py's `PlanMatcher` over one llguidance matcher (never given a stop token)."""

    __slots__ = ("_m", "_stop_ids", "_encode", "_names", "_history", "_plans")

    def __init__(
        self,
        matcher: llguidance.LLMatcher,
        stop_ids: frozenset[int],
        encode: Encode,
        names: NameTail | None = None,
        history: list[int] | None = None,
        plans: dict | None = None,
    ) -> None:
        self._m = matcher
        self._stop_ids = stop_ids
        self._encode = encode
        self._names = names  # the planner's name hint (grammar/checks/plan_names.py), or None
        # every token llguidance accepted since the grammar's start (None: not known), which
        # identifies the state exactly; the live matcher's list is its LLGuidanceMatcher's
        self._history = history
        self._plans = {} if plans is None else plans  # plans by exact state, shared by forks

    def fork(self) -> LLGuidancePlanMatcher:
        names = self._names.fork() if self._names is not None else None
        history = None if self._history is None else list(self._history)
        return LLGuidancePlanMatcher(self._m.deep_copy(), self._stop_ids, self._encode, names, history, self._plans)

    def plan_key(self) -> tuple | None:
        """The exact state a plan starts from (grammar/checks/plan_state.py)."""
        return exact_key(self._history, self._names)

    def plans(self) -> dict:
        return self._plans

    def fill_mask(self, bitmask, row: int) -> None:
        self._m.unsafe_compute_mask_ptr(*row_address(bitmask, row))

    def accept(self, token_id: int) -> bool:
        token_id = int(token_id)
        ok = token_id not in self._stop_ids and self._m.try_consume_tokens([token_id]) == 1
        if ok and self._names is not None:
            self._names.accepted(token_id)
        if ok and self._history is not None:
            self._history.append(token_id)
        return ok

    def rollback(self, num_tokens: int) -> None:
        if num_tokens > 0:
            self._m.rollback(num_tokens)
            if self._names is not None:
                self._names.rolled_back(num_tokens)
            if self._history is not None:
                del self._history[-num_tokens:]

    def names(self) -> NameTail | None:
        return self._names

    def way_outs(self) -> dict:
        return {}  # none kept: llguidance shows only its mask, which a counted repetition's states share

    def is_completed(self) -> bool:
        return self._m.is_accepting()

    def forced_tokens(self) -> list[int]:
        """The forced text in the tokenizer's own encoding, as xgrammar's view gives it: llguidance's
        forced tokens stop before a token that might merge with what follows (`{"price` of
        `{"price":`), which would leave the rest to be planned one character at a time."""
        if self._m.is_stopped():
            return []
        forced = self._m.compute_ff_bytes()
        return self._encode(forced.decode("utf-8", "ignore")) if forced else []

    def state_detail(self) -> bytes:
        return b""  # llguidance shows no parser state: masks alone tell states apart


def only_token(row: bytes) -> int | None:
    """The one token a mask row allows, or None if it allows none or several."""
    words = np.frombuffer(row, dtype=np.uint32)
    nonzero = np.flatnonzero(words)
    if len(nonzero) != 1:
        return None
    word = int(words[nonzero[0]])
    return int(nonzero[0]) * 32 + word.bit_length() - 1 if word & (word - 1) == 0 else None


class ForcedPath:
    """The masks along a grammar's forced path from its start, shared by the grammar's matchers
    (`LLGuidanceHandle`). Each token of the path (`{"` and `name` of a schema whose first
    property is `name`, required) is the only one its mask allows, so the path is one sequence and its
    states are the same in every request: the mask at each depth, down to the first with a choice,
    is computed by llguidance once and copied after (llguidance computes forced positions afresh
    each time, and they are its costliest masks on JSON schemas). Entries are set once and never
    change; two threads computing the same one store equal rows."""

    __slots__ = ("rows", "only")

    def __init__(self) -> None:
        self.rows: dict[tuple[int, int], bytes] = {}  # (depth, row bytes) -> the mask row
        self.only: dict[int, int | None] = {}  # depth -> the one token its mask allows (None: a choice)


class LLGuidanceMatcher(StrictMethods):
    """`forced_path`: the grammar's shared ForcedPath; the matcher is on it while every token it
    holds was the path's, and copies the masks there."""

    __slots__ = (
        "_matcher",
        "_write_mask",
        "_try_consume",
        "_stop_ids",
        "_terminated",
        "values",
        "_plan",
        "_closing",
        "rechecks",
        "_forced",
        "_consumed",
        "_on_path",
        "_history",
    )

    def __init__(
        self,
        start: llguidance.LLMatcher,
        stop_ids: frozenset[int],
        values: ValueCheck | None = None,
        closing: ClosingVocab | None = None,
        encode: Encode | None = None,
        rechecks: RollbackCheck | None = None,
        forced_path: ForcedPath | None = None,
        names: NameHint | None = None,
    ) -> None:
        self._matcher = start.deep_copy()
        self._forced = forced_path
        self._consumed = 0  # tokens accepted and not rolled back
        self._on_path = 0  # how many of them, from the first, are the forced path's
        self.rechecks = rechecks  # check-and-roll-back of the whole output (None: nothing to check)
        # the two per-token calls, bound once (each lookup through the matcher costs ~0.1 us)
        self._write_mask = self._matcher.unsafe_compute_mask_ptr
        self._try_consume = self._matcher.try_consume_tokens
        self._stop_ids = stop_ids
        self.values = values
        # llguidance reports "stopped" as soon as only EOS may follow; terminated (as xgrammar
        # means it) is the stop token having been accepted.
        self._terminated = False
        self._closing = closing if encode is not None else None
        # the planner's view of this state; the name written so far, for its hint, is the value check's
        live = NameTail(names, live=values.scan_state if values is not None else _no_name) if names else None
        self._history: list[int] = []  # the tokens llguidance accepted (the planner's key to this exact state)
        self._plan = LLGuidancePlanMatcher(self._matcher, stop_ids, encode, live, history=self._history)

    def fill_bitmask(self, bitmask, row: int) -> None:
        """Write the allowed next tokens into `bitmask[row]` (int32 CPU tensor, xgrammar layout)."""
        if self._terminated:
            allow_only(bitmask, row, self._stop_ids)
            return
        # straight into the row: the same write as llguidance.torch.fill_next_token_bitmask
        # (same checks, grammar/engines/token_mask.py) without its per-call tensor view
        address, size = row_address(bitmask, row)
        if self._forced is not None and self._on_path == self._consumed < FORCED_DEPTH_KEPT:
            self._fill_on_forced_path(address, size)
        else:
            self._write_mask(address, size)
        if self.values is not None:
            self.values.ban(bitmask, row)
        if self.rechecks is not None:  # (StrictMethods._ban_rewrites, inlined: this runs per token)
            self.rechecks.ban(bitmask, row)

    def _fill_on_forced_path(self, address: int, size: int) -> None:
        key = (self._consumed, size)
        kept = self._forced.rows.get(key)
        if kept is not None:
            ctypes.memmove(address, kept, size)
            return
        self._write_mask(address, size)
        written = ctypes.string_at(address, size)
        self._forced.only.setdefault(self._consumed, only_token(written))
        self._forced.rows.setdefault(key, written)

    def accept(self, token_id: int) -> bool:
        ok = self._accept(token_id)
        if ok:
            if self._on_path == self._consumed and self._forced is not None:
                self._on_path += self._forced.only.get(self._consumed, -1) == int(token_id)
            self._consumed += 1
        if ok and self.values is not None:
            self.values.accept(int(token_id))
        if ok and self.rechecks is not None:
            self.rechecks.accept(int(token_id))
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
        if self._try_consume([token_id]) != 1:
            return False
        self._history.append(token_id)
        return True

    @property
    def forced_path_depth(self) -> int:
        """How many of the accepted tokens, from the first, follow the spec's forced path."""
        return self._on_path

    def rollback(self, num_tokens: int) -> None:
        if num_tokens <= 0:
            return
        self._consumed -= num_tokens
        self._on_path = min(self._on_path, self._consumed)
        if self.values is not None:
            self.values.rollback(num_tokens)
        if self.rechecks is not None:
            self.rechecks.rollback(num_tokens)
        if self._terminated:  # the stop token is always the last one accepted
            self._terminated = False
            num_tokens -= 1
        if num_tokens:
            self._matcher.rollback(num_tokens)
            del self._history[-num_tokens:]

    def is_terminated(self) -> bool:
        return self._terminated

    def is_completed(self) -> bool:
        return self._terminated or self._matcher.is_accepting()

    def valid_prefix(self, token_ids: list[int]) -> int:
        """Leading tokens of `token_ids` accepted in a row (llguidance validates without consuming)."""
        if self._terminated or self._matcher.is_stopped() or not token_ids:
            return 0
        cut = next((i for i, t in enumerate(token_ids) if t in self._stop_ids), len(token_ids))
        kept = self._matcher.validate_tokens(list(token_ids[:cut])) if cut else 0
        return len(without_repeats(self.values, list(token_ids[:kept])))

    def jump_forward_tokens(self, learn: bool = True) -> list[int]:
        """Tokens llguidance forces from here (its canonical tokenization), not accepted."""
        if self._terminated or self._matcher.is_stopped():
            return []
        forced = [t for t in self._matcher.compute_ff_tokens()]
        kept = self._matcher.validate_tokens(forced) if forced else 0
        draft = forced[:kept]
        cut = next((i for i, t in enumerate(draft) if t in self._stop_ids), len(draft))
        return without_repeats(self.values, draft[:cut])
