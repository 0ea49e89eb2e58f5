"""Per-request grammar state for the engine (implements runtime.constraint.TokenMatcher).

Each request gets its own `XGrammarMatcher` over a shared compiled grammar. Besides masking,
it drafts jump-forward tokens: the text the grammar forces from the current state, tokenized the
way the model was seen to write it (`grammar/engines/draft_split.py`; the tokenizer's own encoding where
nothing was seen yet), cut to the longest prefix the grammar accepts so the draft is always
grammar-valid (the engine then verifies it against the model). While a drafted span is being
written, each accepted token teaches the shared splitter how the model splits that text.

For JSON kinds and tool calls a value check (grammar/checks/value_check.py) rides along: every mask it
fills (plain, closing, loop breaking) has the tokens the check forbids cleared (a repeated name or
unique item, an object closed before its dependentRequired names), drafts stop before such a
token, and a completion plan that would write one has that token replaced by another the check
allows (a character that grows the name first) and is re-planned from there, or is dropped.
Bounds count the repaired plan where it is longer (`completion_bound`, and `completion_bound_after`
while a unique array is open), so strict mode's budget and its smallest accepted budget hold for
outputs whose next items must differ from the earlier ones.

The strict methods (completion plans, bounds, closing masks) are grammar/checks/strict.py's, shared with
llguidance's matcher; they plan through `XGrammarPlanMatcher`, grammar/checks/closing.py's `PlanMatcher`
over an xgrammar matcher (forced text in the tokenizer's own encoding, and xgrammar's parser states
to tell apart states whose masks are equal).
"""

from __future__ import annotations

import re

import xgrammar as xgr

from grammar.checks.closing import ClosingVocab
from grammar.checks.plan_names import NameHint, NameTail
from grammar.checks.plan_state import exact_key
from grammar.checks.rollback import RollbackCheck
from grammar.checks.strict import StrictMethods
from grammar.checks.value_check import ValueCheck, without_repeats
from grammar.engines.draft_split import DraftSplitter, Encode, ForcedSpanWatch
from grammar.engines.token_mask import allow_only

_POSITIONS = re.compile(r"rule_start_pos=-?\d+")
MAX_TEXTS = 256  # forced texts a request's planner keeps encoded


class XGrammarPlanMatcher:
    """grammar/checks/closing.py's `PlanMatcher` over one xgrammar matcher."""

    __slots__ = ("_m", "_encode", "_names", "_way_outs", "_history", "_plans", "_texts")

    def __init__(
        self,
        matcher: xgr.GrammarMatcher,
        encode: Encode,
        names: NameTail | None = None,
        way_outs: dict | None = None,
        history: list[int] | None = None,
        plans: dict | None = None,
        texts: dict | None = None,
    ) -> None:
        self._m = matcher
        self._encode = encode
        self._names = names  # the planner's name hint (grammar/checks/plan_names.py), or None
        self._way_outs = {} if way_outs is None else way_outs  # shared by forks: one grammar's states
        # every token accepted since the grammar's start (None: not known), which identifies the
        # state exactly; the live matcher's list is its XGrammarMatcher's
        self._history = history
        self._plans = {} if plans is None else plans  # plans by exact state, shared by forks
        self._texts = {} if texts is None else texts  # forced text -> its tokens (a plan meets the same names)

    def fork(self) -> XGrammarPlanMatcher:
        names = self._names.fork() if self._names else None
        history = None if self._history is None else list(self._history)
        return XGrammarPlanMatcher(
            self._m.fork(), self._encode, names, self._way_outs, history, self._plans, self._texts
        )

    def way_outs(self) -> dict:
        return self._way_outs

    def plan_key(self) -> tuple | None:
        """The exact state a plan starts from (grammar/checks/plan_state.py)."""
        return exact_key(self._history, self._names)

    def plans(self) -> dict:
        return self._plans

    def fill_mask(self, bitmask, row: int) -> None:
        self._m.fill_next_token_bitmask(bitmask, row)

    def accept(self, token_id: int) -> bool:
        ok = self._m.accept_token(token_id)
        if ok and self._names is not None:
            self._names.accepted(token_id)
        if ok and self._history is not None:
            self._history.append(int(token_id))
        return ok

    def rollback(self, num_tokens: int) -> None:
        self._m.rollback(num_tokens)
        if self._names is not None:
            self._names.rolled_back(num_tokens)
        if self._history is not None and num_tokens > 0:
            del self._history[-num_tokens:]

    def names(self) -> NameTail | None:
        return self._names

    def is_completed(self) -> bool:
        return self._m.is_completed()

    def forced_tokens(self) -> list[int]:
        text = self._m.find_jump_forward_string()
        if not text:
            return []
        ids = self._texts.get(text)
        if ids is None:
            if len(self._texts) >= MAX_TEXTS:
                self._texts.clear()
            ids = self._texts[text] = tuple(self._encode(text))
        return list(ids)

    def state_detail(self) -> bytes:
        """xgrammar's parser states (position-free), which separate e.g. the states of a counted
        repetition that masks do not."""
        debug = getattr(self._m, "_debug_print_internal_state", None)
        if debug is None:
            return b""
        try:
            state = debug().rpartition("Last step:")[2]
        except Exception:  # a debugging aid, not an API: planning works without it
            return b""
        return _POSITIONS.sub("", state).encode()


def _no_name() -> None:
    return None


class XGrammarMatcher(StrictMethods):
    __slots__ = (
        "_matcher",
        "_plan",
        "_encode",
        "_special_ids",
        "_closing",
        "_splitter",
        "_watch",
        "values",
        "rechecks",
        "_history",
    )

    def __init__(
        self,
        compiled: xgr.CompiledGrammar,
        encode: Encode,
        special_ids: frozenset[int],
        closing: ClosingVocab | None = None,
        splitter: DraftSplitter | None = None,
        values: ValueCheck | None = None,
        rechecks: RollbackCheck | None = None,
        names: NameHint | None = None,
    ) -> None:
        # Rollback is unlimited in xgrammar >= 0.2 (max_rollback_tokens is deprecated), which
        # jump-forward verification relies on.
        self._matcher = xgr.GrammarMatcher(compiled)
        # the planner's view of this state; the name written so far, for its hint, is the value check's
        live = NameTail(names, live=values.scan_state if values is not None else _no_name) if names else None
        self._history: list[int] = []  # the tokens accepted (the planner's key to this exact state)
        self._plan = XGrammarPlanMatcher(self._matcher, encode, live, history=self._history)
        self._encode = encode
        self._special_ids = special_ids
        self._closing = closing
        self._splitter = splitter
        self._watch: ForcedSpanWatch | None = None  # the drafted span being written, if any
        self.values = values  # repeated names/items are masked out (None: not a JSON kind)
        self.rechecks = rechecks  # check-and-roll-back of the whole output (None: nothing to check)

    def fill_bitmask(self, bitmask, row: int) -> None:
        """Write the allowed next tokens into `bitmask[row]` (int32 CPU tensor, xgrammar layout).

        A terminated matcher allows only its stop tokens (xgrammar itself raises), so a batch
        that still holds a finished request needs no special case.
        """
        if self._matcher.is_terminated():
            allow_only(bitmask, row, self._matcher.stop_token_ids)
            return
        self._matcher.fill_next_token_bitmask(bitmask, row)
        self._ban(bitmask, row)

    def _ban(self, bitmask, row: int) -> None:
        if self.values is not None and not self._matcher.is_terminated():
            self.values.ban(bitmask, row)
        self._ban_rewrites(bitmask, row)

    def accept(self, token_id: int) -> bool:
        ok = self._matcher.accept_token(int(token_id))
        if ok:
            self._history.append(int(token_id))
        if ok and self.values is not None:
            self.values.accept(int(token_id))
        if ok and self.rechecks is not None:
            self.rechecks.accept(int(token_id))
        if ok and self._watch is not None and not self._watch.accepted(int(token_id)):
            self._watch = None
        return ok

    def rollback(self, num_tokens: int) -> None:
        if num_tokens > 0:
            self._matcher.rollback(num_tokens)
            del self._history[-num_tokens:]
            if self.values is not None:
                self.values.rollback(num_tokens)
            if self.rechecks is not None:
                self.rechecks.rollback(num_tokens)
            self._watch = None

    def is_terminated(self) -> bool:
        return self._matcher.is_terminated()

    def is_completed(self) -> bool:
        return self._matcher.is_completed()

    def jump_forward_string(self) -> str:
        """The text the grammar forces from here ('' when the model has a choice)."""
        if self._matcher.is_terminated():
            return ""
        return self._matcher.find_jump_forward_string()

    def valid_prefix(self, token_ids: list[int]) -> int:
        """Leading tokens of `token_ids` accepted in a row (checked by accepting, then rolling
        back the raw matcher, so the value checks and the splitter's watch never see them)."""
        if self._matcher.is_terminated():
            return 0
        accepted = 0
        for token_id in token_ids:
            if token_id in self._special_ids or not self._matcher.accept_token(int(token_id)):
                break
            accepted += 1
        if accepted:
            self._matcher.rollback(accepted)
        return len(without_repeats(self.values, list(token_ids[:accepted])))

    def jump_forward_tokens(self, learn: bool = True) -> list[int]:
        """Forced tokens, not accepted: the forced text split as the model was seen to write it
        (else the tokenizer's own encoding), cut to the longest prefix the matcher accepts
        (checked by accepting, then rolling back). `learn`: the tokens accepted next are the
        model's choices (verify), so let them teach the splitter; False for tokens inserted
        without the model (direct)."""
        text = self.jump_forward_string()
        if not text:
            return []
        if self._splitter is None:
            draft = self._encode(text)
        else:
            draft = self._splitter.split(text)
            self._watch = ForcedSpanWatch(self._splitter, text) if learn else None
        accepted = 0
        for token_id in draft:
            # a forced text that spells a special token (e.g. "<|im_end|>") is not that token
            if token_id in self._special_ids or not self._matcher.accept_token(token_id):
                break
            accepted += 1
        if accepted:
            self._matcher.rollback(accepted)
        return without_repeats(self.values, draft[:accepted])
