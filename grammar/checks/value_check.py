"""Jumpgate's value check: JSON output never repeats an object's name or a unique array's item.

A grammar's token mask has no memory of the names or items already written, so under
`additionalProperties` a model can write the same name twice, and under `uniqueItems` the same
item. This check follows the accepted text byte by byte (strings, escapes, nesting: a token may
span several structural characters) and keeps, per open object, the names written and, per open
array under `uniqueItems`, the canonical form of its items (grammar/checks/value_rules.py says which
arrays and which values are equal). When the mask is filled it simulates, from the current state,
each allowed token that could complete something here, and clears the bit of every token that
would:

- close a name already written in the same object;
- complete an item equal to an earlier one of a unique array (strings at their closing quote,
  numbers and literals at the character after them, objects and arrays at their closing bracket);
- in an array whose items can take only listed values, write an item text that can no longer spell
  an unused value, or a `,` once every value is used (so the array can still close);
- in an integer array, write `0` again (it cannot grow into another number);
- in an array of closed objects whose properties are all free scalars or listed values
  (`ObjectItems` in grammar/checks/value_rules.py), write anything after which the object being written
  could only end equal to an earlier item: a name, a value's text, a value's end or a comma that
  leaves only used combinations (the grammar writes the declared names in order, so what an item
  may still become is a product of per-property choices, counted against the earlier items that
  fit it). A string value can always grow and a number gain a digit, so only their end, a listed
  value or an integer `0` can settle an item; the check bans the earliest token that would, which
  is why it never leaves the object with no way on (and `,` between items once every combination
  is used, so the array closes);
- close an object while a written name's `dependentRequired` names are missing, or write a name
  the grammar orders after such a missing one (it writes declared names in order: it could not
  come back for it).

This is check-and-roll-back done at the mask: the token that would complete a violating value (or,
for object items, commit one to becoming a repeat) is never sampled, so there is nothing to roll
back, no retry budget to spend and nothing streamed to take back; a completion plan that would
write such a token is repaired around it (grammar/engines/xgrammar/matcher.py). Only tokens that can complete something are
simulated (per vocabulary: those holding `"` inside a string; those holding `"`, `,`, `]` or `}`
between values; every allowed one inside a unique array's item or a name with a dependent
missing, where the mask is narrow), and only while an open object holds a name (or misses a
dependent) or a unique array an item. Should the check ever leave no
token at all (a schema where no new value can be written), the grammar's mask is kept and the
repeat is reported by validation after generation; the fidelity report claims the check only
where that cannot happen.
"""

from __future__ import annotations

import functools
import json
import logging

import numpy as np

from grammar.checks.canonical import canonical
from grammar.checks.value_frames import ArrayFrame, ObjectFrame, dependents_pending
from grammar.checks.value_rules import SchemaNavigator
from grammar.checks.value_text import SCALAR_BYTES, ValueCheckVocab, decode_json_string, plain_item, plain_spelling
from grammar.engines.token_mask import allowed_among, allowed_ids

log = logging.getLogger("jumpgate.grammar")

STRUCT, STRING, SCALAR = 0, 1, 2  # where the scan is: between values, in a string, in a number/literal
KEY, VALUE, ITEM, FIELD = 0, 1, 2, 3  # what the current string or scalar is (FIELD: a value of an object item)
_QUOTE, _BACKSLASH, _COMMA = 0x22, 0x5C, 0x2C
_WHITESPACE = frozenset(b" \t\n\r")


def _fail_open(default):
    """A bug in the check must not stop the engine's step: log it once, and from then on let this
    output go unchecked (validation after generation still reports any repeat)."""

    def wrap(method):
        @functools.wraps(method)
        def guarded(self, *args):
            if self.broken:
                return default
            try:
                return method(self, *args)
            except Exception:
                log.exception("value check failed; this output continues unchecked")
                self.broken = True
                return default

        return guarded

    return wrap


class ValueCheck:
    """The check's state for one output (one per request, beside its grammar matcher)."""

    __slots__ = (
        "_vocab",
        "_nav",
        "_begin",
        "_armed",
        "_stack",
        "_mode",
        "_role",
        "_buf",
        "_esc",
        "_text",
        "_history",
        "banned",
        "dead_ends",
        "broken",
    )

    def __init__(
        self, vocab: ValueCheckVocab, navigator: SchemaNavigator | None = None, begin: bytes | None = None
    ) -> None:
        self._vocab = vocab
        self._nav = navigator
        # Tool calls: JSON follows each `begin` marker (free text elsewhere is not followed); the
        # check arms at the marker and disarms when the call's object closes.
        self._begin = begin
        self._armed: bool | bytes = True if begin is None else b""  # True, or the text since the last call
        self._stack: tuple = ()
        self._mode = STRUCT
        self._role = VALUE
        self._buf = b""  # the current name or unique item's text (not kept for other strings)
        self._esc = 0  # inside a string: -1 after a backslash, n > 0 hex digits of a \u still to come
        self._text = bytearray()  # the accepted text (a unique array's object items are read back from it)
        self._history: list[tuple] = []  # the state before each accepted token
        self.banned = 0  # tokens masked out so far
        self.dead_ends = 0  # masks left as the grammar gave them because the check allowed nothing
        self.broken = False  # set by an internal error: the check then stands aside (see _fail_open)

    # -- following the output ------------------------------------------------------------

    @_fail_open(None)
    def accept(self, token_id: int) -> None:
        self._history.append(self._state())
        self._scan(self._vocab.texts[token_id], False)

    @_fail_open(None)
    def rollback(self, num_tokens: int) -> None:
        if num_tokens > 0:
            state = self._history[-num_tokens]
            del self._history[-num_tokens:]
            self._restore(state)

    @_fail_open(None)
    def first_violation(self, token_ids: list[int]) -> int | None:
        """Index of the first of `token_ids` (written in turn from here) that the check forbids."""
        state = self._state()
        try:
            for k, token_id in enumerate(token_ids):
                if self._scan(self._vocab.texts[token_id], True):
                    return k
            return None
        finally:
            self._restore(state)

    @_fail_open([])
    def ban_after(self, token_ids: list[int], bitmask, row: int) -> list[int]:
        """`ban` as it would be after `token_ids` (state unchanged); returns the tokens the row
        then allows, single characters that grow a name or an item first, then shortest first."""
        state = self._state()
        try:
            for token_id in token_ids:
                self._scan(self._vocab.texts[token_id], False)
            self.ban(bitmask, row)
        finally:
            self._restore(state)
        allowed = allowed_ids(bitmask[row].numpy().view(np.uint32)).tolist()
        fillers = [t for t in self._vocab.filler_ids if t in allowed]
        texts = self._vocab.texts
        return fillers + sorted((t for t in allowed if t not in fillers and texts[t]), key=lambda t: len(texts[t]))

    @_fail_open(False)
    def may_steer(self) -> bool:
        """Is a unique array open (whose next items a completion plan may have to write unlike the
        earlier ones)? Names alone never lengthen a plan by more than the repair of one token."""
        return any(type(f) is ArrayFrame and f.rule is not None for f in self._stack)

    def scan_state(self) -> tuple | None:
        """Where the output is, as grammar/checks/plan_names.py's `scan` follows it (None: unknown)."""
        if self.broken or self._armed is not True:
            return None
        stack = "".join("{" if type(f) is ObjectFrame else "[" for f in self._stack)
        if self._mode == STRING:
            name = self._role == KEY
            return stack, True, name, self._esc == -1, False, self._buf if name else None
        top = self._stack[-1] if self._stack else None
        return stack, False, False, False, type(top) is ObjectFrame and top.want_key, None

    def violates(self, token_id: int) -> bool:
        return self.first_violation([token_id]) == 0

    # -- the mask ------------------------------------------------------------------------

    @_fail_open(0)
    def ban(self, bitmask, row: int) -> int:
        """Clear in `bitmask[row]` the allowed tokens the check forbids (see the module docstring); returns
        how many, or -1 when the check would leave the mask empty (it is then restored: see the
        module docstring)."""
        if not self._may_ban():
            return 0
        words = bitmask[row].numpy().view(np.uint32)
        banned = self._closing_a_repeat(words)
        if banned is None:
            candidates = self._candidates()
            if candidates is None:
                allowed = allowed_ids(words)
                top = self._stack[-1] if self._stack else None
                rule = top.rule if self._mode == SCALAR and type(top) is ArrayFrame else None
                if rule is not None and not rule.finite and not (rule.integer_only and self._buf == b"-"):
                    allowed = allowed[~self._vocab.scalar_only[allowed]]  # digits only grow the number
            else:
                allowed = allowed_among(words, candidates)
            banned = [int(t) for t in allowed if self.violates(int(t))]
        if not banned:
            return 0
        ids = np.array(banned, dtype=np.int64)
        kept = words.copy()
        np.bitwise_and.at(words, ids >> 5, ~(np.uint32(1) << (ids & 31).astype(np.uint32)))
        if not words.any():
            words[:] = kept
            self.dead_ends += 1
            return -1
        self.banned += len(banned)
        return len(banned)

    def _may_ban(self) -> bool:
        return any(
            (f.keys and f.free) or dependents_pending(f) if type(f) is ObjectFrame else (f.rule is not None and f.items)
            for f in self._stack
        )

    def _candidates(self) -> np.ndarray | None:
        """The tokens worth simulating here (None: every allowed one)."""
        top = self._stack[-1] if self._stack else None
        if self._steered(top):
            # an object item that must end unlike the earlier ones: names and values are narrow
            # (declared names, listed values, numbers) except a free string's, which only its
            # closing quote can settle
            index = top.model.index.get(top.key)
            if (
                self._mode == STRING
                and self._role == FIELD
                and index is not None
                and top.model.fields[index].kind == "string"
            ):
                return self._vocab.quote_ids
            return None
        in_unique = type(top) is ArrayFrame and top.rule is not None
        # with no unique array open, only a name can repeat, and only a two-quote token writes one whole
        items = any(
            f.start >= 0 or (f.rule is not None if type(f) is ArrayFrame else dependents_pending(f))
            for f in self._stack
        )
        if self._mode == STRING and self._role == KEY and dependents_pending(top):
            return None  # a name is written while a dependent is missing: the grammar's names are few
        if self._mode == STRING:
            if self._role == ITEM and top.rule.finite is not None:
                return None
            return self._vocab.quote_ids if items or self._role != VALUE else self._vocab.two_quote_ids
        if in_unique and self._mode == SCALAR and self._role == ITEM:
            return None  # a number grows: the mask is narrow (digits are then left out)
        if in_unique and self._mode == STRUCT:
            return None if top.rule.finite is not None else self._vocab.item_start_ids
        return self._vocab.struct_ids if items else self._vocab.two_quote_ids

    def _closing_a_repeat(self, words: np.ndarray) -> list[int] | None:
        """Inside a name or a free unique string item: the allowed tokens whose quote would close a
        repeat, found by lookup (None: the state needs the general simulation)."""
        if self._mode != STRING or self._role == VALUE or self._esc or b"\\" in self._buf:
            return None
        top = self._stack[-1]
        if dependents_pending(top) or self._role == FIELD or (type(top) is ObjectFrame and top.model is not None):
            return None
        if self._role == KEY:
            done = [plain_spelling(name) for name in top.keys]
        elif top.rule.finite is None:
            done = [plain_item(c) for c in top.items if c.startswith('"')]
        else:
            return None
        found: list[int] = []
        for raw in done:
            if raw is None:
                return None  # spelled with escapes: simulate
            if raw.startswith(self._buf):
                found += self._vocab.closing_by_text.get(raw[len(self._buf) :], ())
        found = allowed_among(words, np.array(found, dtype=np.int64)).tolist() if found else []
        complex_ids = allowed_among(words, self._vocab.complex_quote_ids)
        return found + [int(t) for t in complex_ids if self.violates(int(t))]

    # -- the scan ------------------------------------------------------------------------

    def _state(self) -> tuple:
        return self._stack, self._mode, self._role, self._buf, self._esc, len(self._text), self._armed

    def _restore(self, state: tuple) -> None:
        self._stack, self._mode, self._role, self._buf, self._esc, length, self._armed = state
        del self._text[length:]

    def _scan(self, data: bytes, check: bool) -> bool:
        """Advance over `data`; True at the first violation when `check` (state then undefined)."""
        base = len(self._text)
        for i, c in enumerate(data):
            if self._armed is not True:  # waiting for a tool call's marker
                seen = (self._armed + bytes((c,)))[-len(self._begin) :]
                self._armed = True if seen == self._begin else seen
                continue
            if self._mode == STRING:
                if self._esc or c != _QUOTE:
                    if self._esc == -1:
                        self._esc = 4 if c == 0x75 else 0  # \uXXXX
                    elif self._esc:
                        self._esc -= 1
                    elif c == _BACKSLASH:
                        self._esc = -1
                    if self._grow(c) and check:
                        return True
                elif self._close_string() and check:
                    return True
                continue
            if self._mode == SCALAR:
                if c in SCALAR_BYTES:
                    if self._grow(c) and check:
                        return True
                    continue
                if self._end_scalar() and check:
                    return True
            if self._between(c, data, base, i) and check:
                return True
        self._text += data
        return False

    def _grow(self, c: int) -> bool:
        if self._role == VALUE:
            return False
        self._buf += bytes((c,))
        if self._role == KEY:
            top = self._stack[-1]
            return (dependents_pending(top) and self._skips_a_dependent(self._buf, False)) or (
                top.model is not None and self._dead()
            )
        if self._role == FIELD:
            return self._dead() if self._narrows() else False
        return self._bad_item_prefix()

    def _steered(self, top) -> bool:
        """Is `top` an object item whose earlier items it must end unlike (so the check steers it)?"""
        return (
            type(top) is ObjectFrame and top.model is not None and len(self._stack) > 1 and bool(self._stack[-2].items)
        )

    def _narrows(self) -> bool:
        """Can the text of the current object item's value just written have narrowed its values?"""
        obj = self._stack[-1]
        index = obj.model.index.get(obj.key)
        if index is None:
            return False
        kind = obj.model.fields[index].kind
        return kind == "listed" or (kind == "integer" and self._buf in (b"0", b"-0"))

    def _dead(self) -> bool:
        """Could the object item being written (the top frame) now only end equal to an earlier one?"""
        obj = self._stack[-1]
        if not self._steered(obj):
            return False
        earlier = self._stack[-2].items
        if self._mode == STRING and self._role == KEY:
            return not obj.model.alive(earlier, obj.done, name=self._buf)
        written = any(n == obj.key for n, _ in obj.done)
        if obj.key is not None and not written and not obj.want_key:
            raw = None
            if self._role == FIELD and self._mode != STRUCT:
                raw = b'"' + self._buf if self._mode == STRING else self._buf
            return not obj.model.alive(earlier, obj.done, key=obj.key, raw=raw)
        return not obj.model.alive(earlier, obj.done, more=obj.want_key and bool(obj.done))

    def _skips_a_dependent(self, raw: bytes, whole: bool) -> bool:
        """Would the name spelled `raw` (so far, or `whole`) pass a missing dependent by?"""
        obj = self._stack[-1]
        writable = obj.deps.writable(obj.keys)
        return not any(s == raw if whole else s.startswith(raw) for s in writable)

    def _bad_item_prefix(self) -> bool:
        arr = self._stack[-1]
        rule = arr.rule
        raw = b'"' + self._buf if self._mode == STRING else self._buf
        if rule.finite is not None:
            return not any(s.startswith(raw) for s in rule.unused_spellings(arr.items))
        # an integer `0` cannot grow into another integer
        return rule.integer_only and raw in (b"0", b"-0") and canonical(0) in arr.items

    def _close_string(self) -> bool:
        self._mode = STRUCT
        if self._role == KEY:
            name = decode_json_string(self._buf)
            obj = self._stack[-1]
            skips = (
                dependents_pending(obj)
                and name not in obj.deps.missing(obj.keys)
                and self._skips_a_dependent(plain_spelling(name) or b"", True)
            )
            keys = obj.keys | {name} if obj.free or obj.deps is not None else obj.keys
            self._stack = self._stack[:-1] + (obj._replace(keys=keys, key=name, want_key=False),)
            return name in obj.keys or skips or (obj.model is not None and self._dead())
        if self._role == ITEM:
            return self._item_done(canonical(decode_json_string(self._buf)))
        if self._role == FIELD:
            return self._field_done(canonical(decode_json_string(self._buf)))
        return False

    def _end_scalar(self) -> bool:
        self._mode = STRUCT
        if self._role not in (ITEM, FIELD):
            return False
        try:
            value = json.loads(self._buf)
        except ValueError:
            value = self._buf.decode("latin-1")  # not JSON (the grammar's business): compare as text
        return self._item_done(canonical(value)) if self._role == ITEM else self._field_done(canonical(value))

    def _field_done(self, canon: str) -> bool:
        """A value of a steered object item is complete: could the item now only end as a repeat?"""
        obj = self._stack[-1]
        self._stack = self._stack[:-1] + (obj._replace(done=obj.done + ((obj.key, canon),)),)
        return self._dead()

    def _item_done(self, canon: str) -> bool:
        arr = self._stack[-1]
        self._stack = self._stack[:-1] + (arr._replace(items=arr.items | {canon}),)
        return canon in arr.items

    def _between(self, c: int, data: bytes, base: int, i: int) -> bool:
        if c in _WHITESPACE:
            return False
        top = self._stack[-1] if self._stack else None
        if c == _COMMA:
            if type(top) is ObjectFrame:
                self._stack = self._stack[:-1] + (top._replace(want_key=True),)
                return top.model is not None and self._dead()
            elif type(top) is ArrayFrame and top.rule is not None:
                return top.rule.exhausted(top.items)  # no unused value left: the array must close
            return False
        if c in b"}]":
            if top is None:
                return False
            missing = dependents_pending(top)  # a written name requires another, not written yet
            self._stack = self._stack[:-1]
            if not self._stack and self._begin is not None:
                self._armed = b""  # the call's object is complete: free text (or the next call) follows
            if top.start < 0:
                return missing
            if top.start >= base:  # the item began within this token
                raw = bytes(data[top.start - base : i + 1])
            else:
                raw = bytes(self._text[top.start :]) + data[: i + 1]
            try:
                return self._item_done(canonical(json.loads(raw))) or missing
            except ValueError:
                return missing
        if c == _QUOTE and type(top) is ObjectFrame and top.want_key:
            self._mode, self._role, self._buf, self._esc = STRING, KEY, b"", 0
            return False
        if top is None and c not in b'{["':
            return False  # outside any JSON value (or a top-level scalar: nothing to keep unique)
        if c not in b'{["' and c not in SCALAR_BYTES:
            return False  # `:` and anything the grammar allows between values
        return self._value_starts(c, top, base + i)

    def _value_starts(self, c: int, top, offset: int) -> bool:
        nav = self._nav
        item = False
        field = type(top) is ObjectFrame and top.model is not None
        if top is None:
            nodes = nav.root_nodes() if nav is not None else None
        elif type(top) is ObjectFrame:
            nodes = nav.value_nodes(top.nodes, top.key or "") if nav is not None and top.nodes is not None else None
        else:
            self._stack = self._stack[:-1] + (top._replace(count=top.count + 1),)
            nodes = nav.item_nodes(top.nodes, top.count) if nav is not None and top.nodes is not None else None
            item = top.rule is not None
        start = offset if item else -1
        if c == 0x7B:  # {
            free = nav is None or nodes is None or nav.names_may_repeat(nodes)
            deps = nav.dependent_names(nodes) if nav is not None and nodes else None
            model = top.rule.objects if item else None
            self._stack += (ObjectFrame(frozenset(), nodes, None, True, start, free, deps, model),)
            return False
        if c == 0x5B:  # [
            rule = nav.item_rule(nodes) if nav is not None and nodes else None
            self._stack += (ArrayFrame(frozenset(), 0, nodes, rule, start),)
            return False
        self._mode = STRING if c == _QUOTE else SCALAR
        self._role, self._esc = (ITEM if item else FIELD if field else VALUE), 0
        self._buf = b"" if c == _QUOTE else bytes((c,))
        if field:
            return self._dead()
        return item and self._bad_item_prefix()


def without_repeats(values: ValueCheck | None, draft: list[int]) -> list[int]:
    """`draft` cut before its first token the check forbids (a jump-forward draft never writes a
    repeated name or item); all of it without a check."""
    cut = values.first_violation(draft) if values is not None and draft else None
    return draft if cut is None else draft[:cut]
