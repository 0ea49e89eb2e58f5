"""The completion planner's hint for object names: spell a required name, not the first name a
letter leads to.

The greedy planner (grammar/checks/closing.py) writes a name one character at a time, taking the
first character that makes progress. Where an object still misses a required name, the grammar
(which writes declared names in order) also lets it write each optional name declared before that
one, and the first letter in vocabulary order usually starts one of those: on SchemaStore's
`citation-file-format` the plan wrote `abstract`, `commit`, `contact`, `preferred-citation` (a
large object of its own) ... and found no end within 1,024 tokens, so strict mode had neither a
closing plan nor a minimum to refuse with at submission.

So a grammar's matchers carry a `NameHint`: the names some object of the schema requires. Where the
planner is inside text that cannot end yet (a name just opened, a name partly written), it first
tries to spell one of those names from what the name holds so far (`spell`, shortest first, each
character accepted by the grammar and the name closable by `"`); only where none fits does the
usual order apply. The names are the whole schema's, not the current object's (a planner's fork
does not know which object it is in): a name another object requires may be written here as an
optional one, which costs its minimal value, never validity (every step is the grammar's).

`NameTail` follows, on a planner's fork, where the text is (`scan`: containers, strings, and whether
a string is a name, so a string value is never spelled as a name); the live matcher's state is
read from its value check, which follows the output.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

MAX_TAIL = 64  # a name's text kept for matching (longer: no required name matches)
MAX_SPELL_TRIES = 256  # characters accepted while looking for a name that fits, per planner step


def required_names(schema: Any, limit: int = 4096) -> frozenset[str]:
    """Every name listed by a `required` anywhere in `schema` (at most `limit` nodes walked)."""
    found: set[str] = set()
    stack, walked = [schema], 0
    while stack and walked < limit:
        node = stack.pop()
        walked += 1
        if isinstance(node, dict):
            names = node.get("required")
            if isinstance(names, list):
                found.update(n for n in names if isinstance(n, str))
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return frozenset(found)


class NameHint:
    """Required names as bytes (shortest first) and how to spell them: one token per character
    (`singles`), and each token's text (to follow a fork's text)."""

    __slots__ = ("names", "texts", "singles", "quote")

    def __init__(self, names: Iterable[str], texts: list[bytes], singles: dict[int, int], quote: int | None) -> None:
        self.names = tuple(sorted({n.encode() for n in names}, key=lambda n: (len(n), n)))
        self.texts = texts
        self.singles = singles  # byte -> the id of the token that is that one character
        self.quote = quote  # the id of `"`

    def spell(self, m, tail: bytes) -> list[int] | None:
        """Accept on `m` (a `PlanMatcher`) the rest of the shortest required name that starts with
        `tail` and that the grammar takes here, a name it lets close; return those tokens, or None
        (nothing accepted) when none fits."""
        if self.quote is None:
            return None
        dead: set[bytes] = set()
        tries = 0
        for name in self.names:
            if len(name) <= len(tail) or not name.startswith(tail):
                continue
            rest = name[len(tail) :]
            if any(rest[:k] in dead for k in range(1, len(rest) + 1)):
                continue
            took: list[int] = []
            for k, c in enumerate(rest):
                token = self.singles.get(c)
                if token is None or tries >= MAX_SPELL_TRIES or not m.accept(token):
                    dead.add(rest[: k + 1])
                    break
                tries += 1
                took.append(token)
            else:
                if m.accept(self.quote):  # the name may end here
                    m.rollback(1)
                    return took
                dead.add(rest)
            m.rollback(len(took))
            if tries >= MAX_SPELL_TRIES:
                return None
        return None


def name_hint(memo: dict, navigator, value_vocab, closing) -> NameHint | None:
    """A grammar's `NameHint` (made once, kept in the handle's `memo`): from its value check's schema
    (`navigator`, a `SchemaNavigator`), token texts (`value_vocab`, a `ValueCheckVocab`) and the
    closing vocabulary's single characters; None where any is missing or no name is required."""
    if navigator is None or value_vocab is None or closing is None:
        return None
    if "names" not in memo:
        names = navigator.required_names()
        memo["names"] = NameHint(names, value_vocab.texts, closing.single_bytes, closing.quote_id) if names else None
    return memo["names"]


# Where a planner's fork is in the JSON text: (open containers, `{` or `[` each; inside a string;
# that string is a name; a backslash just read; a name comes next; the name so far or None).
ScanState = tuple[str, bool, bool, bool, bool, "bytes | None"]
_WHITESPACE = frozenset(b" \t\n\r")


def scan(state: ScanState, data: bytes) -> ScanState:
    """`state` after the text `data` (what a name is: a string opened where an object wants one)."""
    stack, in_str, name, esc, want, tail = state
    for c in data:
        if in_str:
            if esc:
                esc = False
            elif c == 0x5C:
                esc = True
            elif c == 0x22:
                in_str, name, tail = False, False, None
                continue
            if tail is not None:
                tail = tail + bytes((c,)) if len(tail) < MAX_TAIL else None
        elif c in _WHITESPACE:
            continue
        elif c == 0x22:
            in_str, name, esc = True, want and stack.endswith("{"), False
            tail, want = (b"" if name else None), False
        elif c in b"{[":
            stack, want = stack + chr(c), c == 0x7B
        elif c in b"}]":
            stack, want = stack[:-1], False
        elif c == 0x2C:
            want = stack.endswith("{")
        else:
            want = False
    return stack, in_str, name, esc, want, tail


class NameTail:
    """The name so far along one planner fork: a stack of `ScanState`s, one per accepted token, so
    that rollback restores it. The live matcher's reads its state from `live` instead (its value
    check's `scan_state`) and keeps no stack of its own."""

    __slots__ = ("hint", "_states", "_live")

    def __init__(
        self, hint: NameHint, start: ScanState | None = None, live: Callable[[], ScanState | None] | None = None
    ) -> None:
        self.hint = hint
        self._live = live
        self._states: list[ScanState | None] | None = None if live is not None else [start]

    def state(self) -> ScanState | None:
        return self._live() if self._states is None else self._states[-1]

    @property
    def tail(self) -> bytes | None:
        """The text of the name being written here (None: not inside a name, or not known)."""
        state = self.state()
        return None if state is None or not state[2] else state[5]

    def fork(self) -> NameTail:
        return NameTail(self.hint, self.state())

    def accepted(self, token_id: int) -> None:
        if self._states is not None:
            state = self._states[-1]
            texts = self.hint.texts
            data = texts[token_id] if 0 <= token_id < len(texts) else b""
            self._states.append(None if state is None else scan(state, data))

    def rolled_back(self, num_tokens: int) -> None:
        if self._states is not None and num_tokens > 0:
            del self._states[max(1, len(self._states) - num_tokens) :]
