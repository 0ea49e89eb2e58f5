"""Shortest-completion planning for strict JSON: how many tokens until the value is complete, and
which tokens lead there fastest.

The plan is greedy over token classes, tried in order at each state:
1. text the grammar forces (jump-forward) is followed as is;
2. outside text, a model format's *markers* (gpt-oss's `<|constrain|>`): the one token the model writes;
3. *structural closers*: tokens made only of `]` and `}` (an array or object ends);
4. *string closers*: `"` optionally followed by `]` / `}` (a string ends, maybe its containers);
5. closers that also carry a comma (a number ends; the next array item or property begins);
6. *minimal values*: `0`, `false`, `true`, `null`, `[]`, `{}`, `""`;
7. any single-character token the grammar allows (a pattern, an enum, a minLength).
In free text outside a JSON string (a regex, an EBNF rule) a single character that completes the match is
taken first; inside a string that cannot end yet, a required name the grammar takes is spelled first
(`NameHint`, grammar/checks/plan_names.py), else, where nothing makes progress, the shortest run of
characters after which the string may end (`_way_out`, its answers kept per request). Inside text `]`,
`}`, `,` and `0` are just characters, so there the order is string closers, single characters, then the
rest. A candidate is taken only if it makes progress (a `"` that opens a string, a closer that leads back
to the same state, or a value leading to a state met since the last forced text do not); when nothing
does (`[0-9]{5}`), the first candidate not yet taken from such a state is taken. States are told apart
by their token mask plus what the engine shows of its state (`state_detail`: xgrammar's parser states;
llguidance: none). The planner drives a matcher only through `PlanMatcher`, which each engine's matcher
implements (grammar/engines/*/matcher.py); the strict methods on it are shared (grammar/checks/strict.py).
A plan walked on a forked matcher bounds the tokens needed; a request with a tight budget follows it.
Plans are kept by exact state where the matcher knows it (grammar/checks/plan_state.py).
"""

from __future__ import annotations

import torch

from grammar.checks.plan_state import PlanMatcher, Rests, kept_plan
from grammar.engines.token_mask import allow_only, is_allowed

# Plans longer than this are not made (no closing): a schema with dozens of required properties
# needs several hundred tokens (44 properties at three levels: 253), so the cap sits well above that.
MAX_PLAN_TOKENS = 1024
MAX_TRIES = 64  # candidates per step that make no progress, before falling back
MAX_CLASS_TESTS = 16  # closing mask: class members checked for progress
MAX_WAY_OUT_DEPTH = 8  # characters searched ahead for the end of a string a plan is stuck in
MAX_WAY_OUT_TRIES = 2048  # characters tried in those searches, in all of one plan's
MAX_LOOP_WALKS = 4  # states a plan went round, each walked again taking the other way first
# A walk that has taken this many tokens in a row from states it met before (no forced text
# between) may be going round: citation-file-format's `orcid` (a string that must hold an ORCID
# URL somewhere) was written `!` after `!` to the 1,024-token limit, about a second a walk. From
# there the walk's token is taken again, one accept and one mask a token, not a step's dozens of
# tries: if the state stays until the limit, the walk ends with no plan as it would have; if not
# (a `minLength: 200` string, whose masks look alike until its end), it is walked again in full.
MAX_STALE_STEPS = 128
_FILLERS = ["0", "false", "true", "null", "[]", "{}", '""']
_LETTERS = ["x", "q", "z", "k"]  # allowed here => inside text (none can go on a number or literal)


def new_bitmask(vocab_size: int) -> torch.Tensor:
    """One bitmask row allowing everything (as xgrammar's allocate_token_bitmask)."""
    return torch.full((1, (vocab_size + 31) // 32), -1, dtype=torch.int32)


class ClosingVocab:
    """Token classes of one vocabulary, computed once per tokenizer."""

    def __init__(self, hf_tokenizer, vocab_size: int, stop_token_ids: list[int], special_ids: frozenset, markers=()):
        self.vocab_size = vocab_size
        self.special_ids = frozenset(special_ids)
        self.stop_ids = torch.tensor(sorted(stop_token_ids), dtype=torch.int64)
        self.stop_set = frozenset(stop_token_ids)
        pieces = hf_tokenizer.convert_ids_to_tokens(list(range(min(vocab_size, len(hf_tokenizer)))))
        structural, quoted, comma, singles = [], [], [], []
        for i, p in enumerate(pieces):
            if p is None or i in special_ids or not p:
                continue
            if set(p) <= set("]}"):
                structural.append((len(p), i))
            elif p[0] == '"' and set(p[1:]) <= set("]}"):
                quoted.append((len(p), i))
            elif p.count(",") == 1 and p.count('"') < 2 and set(p) <= set('"]},'):
                comma.append((len(p), i))
            if len(p) == 1:
                singles.append(i)
        vocab = hf_tokenizer.get_vocab()
        self.structural = _ids([i for _, i in sorted(structural, reverse=True)])  # longest (closes most) first
        self.quoted = _ids([i for _, i in sorted(quoted, reverse=True)])
        self.closers = torch.cat([self.structural, self.quoted])
        self.comma_closers = _ids([i for _, i in sorted(comma, reverse=True)])  # `,"` before `,`
        self.fillers = _ids([vocab[f] for f in _FILLERS if f in vocab])
        # a newline or a space first: in a regex they often end an item
        first = [vocab[c] for c in ("\u010a", "\u0120") if c in vocab]
        self.singles = _ids(first + [i for i in singles if i not in first])
        self.letters = _ids([vocab[c] for c in _LETTERS if c in vocab])
        self.markers = _ids(sorted(i for i in markers if i < vocab_size and i not in special_ids))  # outside text
        self.classes = [self.markers, self.structural, self.quoted, self.comma_closers, self.fillers, self.singles]
        # inside text `]`, `}`, `,` and `0` are just characters: a quote ends a JSON string, a
        # newline or a space an item of a pattern
        self.text_classes = [self.quoted, self.singles, self.comma_closers, self.fillers]
        self.quote_id = vocab.get('"')
        # byte -> the token that is that one printable ASCII character (the planner spells names with them)
        self.single_bytes = {
            ord(pieces[i]): i for i in reversed(singles) if pieces[i].isascii() and pieces[i].isprintable()
        }
        self.quote_led = frozenset(i for _, i in quoted + comma if pieces[i].startswith('"'))
        self._closer_set = set(self.closers.tolist()) | set(self.comma_closers.tolist())
        # Tokens that may commit the output to more structure (a new item, property, string or
        # line): the ones checked against the budget before they are chosen.
        self.expanding = frozenset(
            i for i, p in enumerate(pieces) if p and i not in special_ids and any(c in p for c in ',[{"\u010a')
        )

    def is_closer(self, token_id: int) -> bool:
        return token_id in self._closer_set


def _ids(ids: list[int]) -> torch.Tensor:
    return torch.tensor(ids, dtype=torch.int64)


def allowed_subset(mask_row: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """The ids among `ids` whose bit is set in one (CPU) bitmask row (numpy: 8 torch ops cost more)."""
    if ids.numel() == 0:
        return ids
    at = ids.numpy()
    return torch.from_numpy(at[((mask_row.numpy()[at >> 5] >> (at & 31)) & 1).astype(bool)])


def _signature(mask_row: torch.Tensor, m: PlanMatcher) -> bytes:
    """What tells two matcher states apart for planning: the allowed-token mask and what the
    engine shows beyond it (xgrammar's parser states, which separate e.g. the states of a counted
    repetition that masks do not)."""
    return mask_row.numpy().tobytes() + m.state_detail()


class _State:
    """The state a plan step starts from: its signature, whether it is in text, whether a string may close."""

    def __init__(self, mask_row: torch.Tensor, m: PlanMatcher, vocab: ClosingVocab):
        self.sig = _signature(mask_row, m)
        self.in_text = bool(allowed_subset(mask_row, vocab.letters).numel())
        self.closable = bool(allowed_subset(mask_row, vocab.quoted).numel())


def _progress(
    vocab: ClosingVocab,
    ids: torch.Tensor,
    tok: int,
    here: _State,
    after_row: torch.Tensor,
    m: PlanMatcher,
    seen: set[bytes],
) -> bool:
    """Does `tok` (of class `ids`), leading to `m`'s state with mask `after_row`, make progress?"""
    if tok in vocab.quote_led and is_allowed(after_row, vocab.quote_id):
        return False  # it opened a string: a closed string is never followed by `"`
    if ids is vocab.structural:
        return not here.in_text
    if ids is vocab.quoted:
        return _signature(after_row, m) != here.sig  # a `"` that is just a character of a pattern leads back here
    return _signature(after_row, m) not in seen


def _completing_single(m: PlanMatcher, vocab: ClosingVocab, mask_row: torch.Tensor) -> int | None:
    """Accept and return a single-character token after which the match is complete, if any: in
    free text (`[a-z]+(, [a-z]+)*\\.`) the other characters make "progress" too, and a separator
    followed by forced text would start item after item."""
    for tok in allowed_subset(mask_row, vocab.singles).tolist():
        if m.accept(tok):
            if m.is_completed():
                return tok
            m.rollback(1)
    return None


def _way_out(m: PlanMatcher, vocab: ClosingVocab, budget: list[int], start: bytes, row: torch.Tensor) -> int | None:
    """The first character of the shortest run of characters after which a string closer is allowed
    (breadth-first, MAX_WAY_OUT_DEPTH deep, each try off `budget[0]`, shared by one plan's searches);
    else a plan goes through the alphabet in a pattern's free part, never ending it. `start`: the
    state's signature, which the caller holds (a kept answer costs one lookup); `row`: scratch."""
    memo = m.way_outs()  # a request's plans meet the same states again
    if start in memo:
        return memo[start]
    out = _search_way_out(m, vocab, budget, row, start)
    if out is not None or budget[0] > 0:  # not a search this plan's budget cut short
        memo[start] = out
    return out


def _search_way_out(m: PlanMatcher, vocab: ClosingVocab, budget: list[int], row: torch.Tensor, start: bytes):
    seen, frontier = {start}, [[]]  # the states met; the runs to go on from
    for _ in range(MAX_WAY_OUT_DEPTH):
        reached: list[list[int]] = []
        for path in frontier:
            for t in path:
                m.accept(t)  # taken from this state before
            m.fill_mask(row, 0)
            for tok in allowed_subset(row[0], vocab.singles).tolist():
                if budget[0] <= 0:
                    break
                if not m.accept(tok):
                    continue
                budget[0] -= 1
                m.fill_mask(row, 0)
                if allowed_subset(row[0], vocab.quoted).numel():
                    m.rollback(1 + len(path))
                    return (path + [tok])[0]
                sig = _signature(row[0], m)
                if sig not in seen:
                    seen.add(sig)
                    reached.append(path + [tok])
                m.rollback(1)
            m.rollback(len(path))
        frontier = reached
        if not frontier or budget[0] <= 0:
            break
    return None


def _spelled(m: PlanMatcher, after: torch.Tensor) -> int | None:
    """Accept and return the first character of a required name that fits here (plan_names.py)."""
    names = m.names()
    tail = names.tail if names is not None else None
    if tail is None:
        return None
    took = names.hint.spell(m, tail)
    if not took:
        return None
    m.rollback(len(took) - 1)
    m.fill_mask(after, 0)
    return took[0]


def _step(
    m: PlanMatcher,
    vocab: ClosingVocab,
    mask: torch.Tensor,
    after: torch.Tensor,
    seen: set[bytes],
    taken: dict[bytes, set[int]],
    branches: dict[bytes, set[int]] | None = None,
    looped: dict[bytes, set[int]] | None = None,
    search: list[int] | None = None,
) -> int | None:
    """Accept the plan's next token from `m`'s state (mask `mask[0]`): the first candidate in class
    order that makes progress, else the first not yet taken from a state like this. `branches`: what
    each state took (a state met again: the plan went round, so those come last, noted in `looped`).
    `search`: the plan's budget left for `_way_out`. Leaves `after[0]` the new state's mask; None if
    the grammar allows no candidate."""
    here = _State(mask[0], m, vocab)
    seen.add(here.sig)
    done = taken.setdefault(here.sig, set())
    went = branches.setdefault(here.sig, set()) if branches is not None else set()
    if here.in_text and not here.closable:
        # free text of a regex or EBNF: end it if one character can
        tok = _completing_single(m, vocab, mask[0])
        if tok is not None:
            done.add(tok)
            m.fill_mask(after, 0)
            return tok
    if not here.closable:
        # a string that cannot end here (a name, even where its next letters are few): spell a
        # required name if one fits
        tok = _spelled(m, after)
        if tok is not None:
            done.add(tok)
            went.add(tok)
            return tok
    fallback = first = again = None
    tries = 0
    for ids in vocab.text_classes if here.in_text else vocab.classes:
        for j, tok in enumerate(allowed_subset(mask[0], ids).tolist()):
            if tries >= MAX_TRIES and first is not None:
                break
            if not m.accept(tok):
                continue
            m.fill_mask(after, 0)
            if _progress(vocab, ids, tok, here, after[0], m, seen):
                if tok in went:  # taken from this state before: another way first
                    m.rollback(1)
                    again = tok if again is None else again
                    if looped is not None:
                        looped.setdefault(here.sig, set()).add(tok)
                    continue
                done.add(tok)
                went.add(tok)
                return tok
            m.rollback(1)
            tries += 1
            first = tok if first is None else first
            if fallback is None and tok not in done:
                fallback = tok
            if j == 0 and ids is vocab.fillers:
                break  # `0` leads nowhere: neither will `false` (inside text, all are characters)
    if again is None and here.in_text and not here.closable:
        # nothing makes progress inside a string that cannot end yet (`(.+)\.(ya?ml)` after a
        # space): the first character of the shortest run after which it may end
        out = _way_out(m, vocab, search if search is not None else [MAX_WAY_OUT_TRIES], here.sig, after)
        fallback = out if out is not None else fallback
    tok = again if again is not None else fallback if fallback is not None else first
    if tok is None:
        return None
    done.add(tok)
    went.add(tok)
    m.accept(tok)
    m.fill_mask(after, 0)
    return tok


def _accept_forced(m: PlanMatcher, vocab: ClosingVocab) -> list[int]:
    """Accept the forced text in the model tokenizer's own tokens (as jump-forward drafts it); return them."""
    took: list[int] = []
    for t in m.forced_tokens():
        if t in vocab.special_ids or not m.accept(t):
            break
        took.append(t)
    return took


def completion_plan(matcher: PlanMatcher, vocab: ClosingVocab, limit: int = MAX_PLAN_TOKENS) -> list[int] | None:
    """The tokens of the greedy plan from `matcher`'s state (not changed) to a complete value;
    None if none within `limit` tokens. Where the plain walk finds none, a walk that went round a
    state (kimi's `<|tool_call` begins both the next call and the section end) is walked again per
    such state, taking the other way there; the shortest walk is the plan. (Not always: JSON values
    revisit states all the time, and those walks cost a plan 17x.)"""
    return kept_plan(matcher, limit, lambda: _walks(matcher, vocab, limit))


def _walks(matcher: PlanMatcher, vocab: ClosingVocab, limit: int) -> tuple[list[int] | None, bool]:
    """`completion_plan`'s walks: the plan, and whether no way-out search in them was cut short."""
    budgets: list[list[int]] = []
    plan, looped = _walk_plan(matcher, vocab, limit, None, None, budgets), {}
    plan = plan if plan is not None else _walk_plan(matcher, vocab, limit, {}, looped, budgets)
    for sig, toks in list(reversed(looped.items()))[:MAX_LOOP_WALKS]:
        again: dict[bytes, set[int]] = {}
        other = _walk_plan(matcher, vocab, limit, {sig: toks}, again, budgets)
        if other is not None and (plan is None or len(other) < len(plan)):
            plan = other
            if not again:
                break
    return plan, all(b[0] > 0 for b in budgets)


def _walk_plan(
    matcher: PlanMatcher,
    vocab: ClosingVocab,
    limit: int,
    avoid: dict[bytes, set[int]] | None,
    looped: dict[bytes, set[int]] | None,
    budgets: list[list[int]],
    search: list[int] | None = None,
    capped: bool = True,
) -> list[int] | None:
    """One greedy walk (its way-out budget put in `budgets`, or `search` given: a walk made again,
    which meets the same searches' answers kept); with `avoid`, a state's tokens are taken last."""
    m = matcher.fork()
    mask, after = new_bitmask(vocab.vocab_size), new_bitmask(vocab.vocab_size)
    plan: list[int] = []
    seen: set[bytes] = set()
    taken: dict[bytes, set[int]] = {}
    branches = None if avoid is None else {sig: set(toks) for sig, toks in avoid.items()}
    have_mask = False
    stale = 0  # tokens taken in a row from states met before
    if search is None:
        budgets.append(search := [MAX_WAY_OUT_TRIES])
    rests = Rests.of(m) if avoid is None else None  # after forced text, a plain walk's rest is the state's
    while len(plan) <= limit:
        if m.is_completed():
            if rests is not None:
                rests.keep(plan, search[0] > 0)
            return plan
        took = _accept_forced(m, vocab)
        if took:
            plan += took
            seen.clear()
            taken.clear()
            have_mask = False
            stale = 0
            rest = None if rests is None else rests.at(len(plan))
            if rest is not None:
                plan += rest
                rests.keep(plan, search[0] > 0)
                return plan if len(plan) <= limit else None
            continue
        if not have_mask:
            m.fill_mask(mask, 0)
        met = len(seen)
        tok = _step(m, vocab, mask, after, seen, taken, branches, looped, search)
        if tok is None:
            return None
        stale = stale + 1 if len(seen) == met and capped else 0
        if stale > MAX_STALE_STEPS:
            if _stays(m, tok, after, limit - len(plan)):
                return None
            return _walk_plan(matcher, vocab, limit, avoid, looped, budgets, search, capped=False)
        plan.append(tok)
        mask, after = after, mask
        have_mask = True
    return None


def _stays(m: PlanMatcher, tok: int, row: torch.Tensor, steps: int) -> bool:
    """Does taking `tok` again and again leave `m` in the state it is in (mask `row[0]`), never
    complete, for `steps` tokens? (Then a walk going round there ends with no plan.)"""
    sig = _signature(row[0], m)
    for _ in range(steps):
        if not m.accept(tok):
            return False
        m.fill_mask(row, 0)
        if m.is_completed() or _signature(row[0], m) != sig:
            return False
    return True


def completion_bound(matcher: PlanMatcher, vocab: ClosingVocab, limit: int = MAX_PLAN_TOKENS) -> int | None:
    """Tokens of the greedy plan from `matcher`'s state (not changed); None if none within `limit`."""
    return None if (plan := completion_plan(matcher, vocab, limit)) is None else len(plan)


def completion_bound_after(matcher: PlanMatcher, vocab: ClosingVocab, token_id: int) -> int | None:
    """The plan's length after `token_id` (None: the grammar refuses it, or no plan)."""
    m = matcher.fork()
    return completion_bound(m, vocab) if m.accept(token_id) else None


def _progress_members(
    matcher: PlanMatcher,
    vocab: ClosingVocab,
    mask_row: torch.Tensor,
    here: _State,
    classes: list[torch.Tensor],
    limit: int = MAX_CLASS_TESTS,
) -> list[int]:
    """Allowed tokens of the first of `classes` that has any, each checked to make progress."""
    after = new_bitmask(vocab.vocab_size)
    for ids in classes:
        if ids is vocab.structural and here.in_text:
            continue  # characters of a string
        keep = []
        for t in allowed_subset(mask_row, ids).tolist()[:limit]:
            f = matcher.fork()
            if f.accept(t):
                f.fill_mask(after, 0)
                if _progress(vocab, ids, t, here, after[0], f, {here.sig}):
                    keep.append(t)
        if keep:
            return keep
    return []


def fill_closing_bitmask(
    matcher: PlanMatcher,
    vocab: ClosingVocab,
    bitmask: torch.Tensor,
    row: int,
    tight: bool = False,
    plan_token: int | None = None,
) -> None:
    """Mask for closing mode: the stop token once complete; forced text in the plan's own
    tokenization; else the plan's next token (`plan_token`, or planned here) and, unless `tight`,
    the other tokens of its class that also make progress (the model chooses among those)."""
    if matcher.is_completed():
        allow_only(bitmask, row, vocab.stop_ids)
        return
    matcher.fill_mask(bitmask, row)
    forced = matcher.forced_tokens()
    if forced:
        first = [plan_token] if plan_token is not None else forced[:1]
        if first and first[0] not in vocab.special_ids and is_allowed(bitmask[row], first[0]):
            allow_only(bitmask, row, first)
            return
    mask = bitmask[row : row + 1].clone()
    tok = plan_token
    if tok is None:
        tok = _step(matcher.fork(), vocab, mask, new_bitmask(vocab.vocab_size), set(), {})
        if tok is None:
            return  # nothing to plan with: the grammar's own mask stays
    keep = [tok]
    if not tight:
        cls = next((ids for ids in vocab.classes if bool((ids == tok).any())), None)
        if cls is not None:
            here = _State(mask[0], matcher, vocab)
            keep += [t for t in _progress_members(matcher, vocab, mask[0], here, [cls]) if t != tok]
    allow_only(bitmask, row, keep)


def fill_plan_bitmask(bitmask: torch.Tensor, row: int, token_id: int) -> None:
    """Allow exactly `token_id` (the next token of a stored plan)."""
    allow_only(bitmask, row, [token_id])


def fill_value_closing_bitmask(matcher: PlanMatcher, vocab: ClosingVocab, bitmask: torch.Tensor, row: int) -> bool:
    """Loop breaking: allow only tokens that end the current value (the stop token where the value
    is the whole output and complete, a top-level number); False if none is allowed now (the row
    then holds the grammar's plain mask)."""
    matcher.fill_mask(bitmask, row)
    here = _State(bitmask[row], matcher, vocab)
    keep = _progress_members(
        matcher, vocab, bitmask[row], here, [vocab.structural, vocab.quoted, vocab.comma_closers], limit=64
    )
    if not keep and matcher.is_completed():
        keep = allowed_subset(bitmask[row], vocab.stop_ids).tolist()
    if keep:
        allow_only(bitmask, row, keep)
        return True
    return False
