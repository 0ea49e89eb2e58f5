"""The value family a check-and-roll-back rewrite is held to: what the keyword a value broke still
allows there, as JSON texts, so that the rewrite's mask carries that keyword.

Banning only the failed text (grammar/checks/rollback.py) lets the model write the next free
string of the same kind, which breaks the same keyword again: a root `if`/`else` that narrows
dependabot's `package-ecosystem` to an enum the grammar does not mask, rewritten as `"pip3"`,
`"python"`, `"pypi"`... until the rewrites run out. So the keyword itself becomes part of the mask
at that value on the next attempt:

- `enum` / `const`: the value is one of the listed values, spelled as JSON (compact; a string also
  with non-ASCII escaped, an integral float also as an integer);
- `type`: the value opens as that type does (`"`, `{`, `[`, a digit or `-`; `true`/`false`/`null`
  whole).

A family is a tuple of (text, whole) entries: `whole` texts are the value itself, the others only
its opening bytes. Several errors at one value intersect their families (`combine`). Keywords whose
values no small set of texts describes (`pattern`, `minimum`, ...) give no family: the failed text
alone is banned, as before.
"""

from __future__ import annotations

import json
from typing import Any, Iterable

import numpy as np

from grammar.engines.token_mask import allowed_ids

Family = tuple[tuple[bytes, bool], ...]
MAX_LISTED = 256  # listed values beyond this are not made a family (the mask's candidate scan grows with it)
SCALAR = frozenset(b"0123456789+-.eEtrufalsn")  # what numbers, true, false and null are made of
_TYPE_STARTS: dict[str, Family] = {
    "string": ((b'"', False),),
    "object": ((b"{", False),),
    "array": ((b"[", False),),
    "integer": tuple((bytes([c]), False) for c in b"-0123456789"),
    "number": tuple((bytes([c]), False) for c in b"-0123456789"),
    "boolean": ((b"true", True), (b"false", True)),
    "null": ((b"null", True),),
}


def spellings(value: Any) -> list[bytes]:
    """The JSON texts a grammar may write for `value`: compact, non-ASCII as is and escaped, an
    integral float also as an integer."""
    texts = [json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()]
    texts.append(json.dumps(value, separators=(",", ":")).encode())
    if isinstance(value, float) and value.is_integer():
        texts.append(str(int(value)).encode())
    return list(dict.fromkeys(texts))


def error_family(validator: str, value: Any) -> Family | None:
    """The family of a value that broke keyword `validator` (whose schema value is `value`), or None
    where the keyword is not a set of texts."""
    if validator == "enum" and isinstance(value, list) and 0 < len(value) <= MAX_LISTED:
        return tuple((t, True) for v in value for t in spellings(v))
    if validator == "const":
        return tuple((t, True) for t in spellings(value))
    if validator == "type":
        names = [value] if isinstance(value, str) else value if isinstance(value, list) else []
        found = tuple(e for name in names for e in _TYPE_STARTS.get(name, ()))
        return found or None
    return None


def combine(families: Iterable[Family]) -> Family | None:
    """The entries every family admits (None for no family; an empty tuple when they exclude each
    other, which the caller treats as none)."""
    result: Family | None = None
    for family in families:
        if result is None:
            result = family
            continue
        both: dict[bytes, bool] = {}
        for ta, wa in result:
            for tb, wb in family:
                if wa and wb:
                    if ta == tb:
                        both[ta] = True
                elif ta.startswith(tb) and (wa or not wb):
                    both[ta] = both.get(ta, False) or wa
                elif tb.startswith(ta) and (wb or not wa):
                    both[tb] = both.get(tb, False) or wb
        result = tuple(both.items())
    return result


def family_candidates(prefix: bytes, family: Family, text: bytes, vocab, words: np.ndarray) -> np.ndarray | None:
    """Token ids that keep `text` (the accepted output) on its way to `prefix` followed by one of
    the family's texts; None where the family no longer applies (the value is written, or the
    text has left `prefix`). `vocab` is a `RollbackVocab`; `words` the mask row (uint32), read
    only to end a whole scalar (`2` may go on to `23`: only a non-scalar byte ends it)."""
    if not (prefix.startswith(text) or text.startswith(prefix)):
        return None
    found: list[int] = []
    live = False
    for entry, whole in family:
        target = prefix + entry
        scalar = whole and entry[-1] in SCALAR
        if text.startswith(target):
            if not scalar or len(text) > len(target):
                return None  # the value is one of the family's
            live = True  # a whole scalar written: only what ends it here
            found += [i for i in allowed_ids(words).tolist() if vocab.texts[i] and vocab.texts[i][0] not in SCALAR]
            continue
        if not target.startswith(text):
            continue
        live = True
        rest = target[len(text) :]
        for k in range(1, min(len(rest), vocab.longest) + 1):
            found += vocab.exactly(rest[:k])
        longer = vocab.starting_with(rest).tolist()
        if scalar:
            longer = [i for i in longer if len(vocab.texts[i]) > len(rest) and vocab.texts[i][len(rest)] not in SCALAR]
        else:
            longer = [i for i in longer if len(vocab.texts[i]) > len(rest)]
        found += longer
    if not live:
        return None
    return np.unique(np.array(found, dtype=np.int64))


# -- the same family for every item of an array (the same schema place) ----------------------
# A value that broke its keyword inside an array item (dependabot's `updates[9].package-ecosystem`,
# an enum its root `else` imposes) is one of many written by the same schema: the rewrite holds its
# family at every such place (`["updates", *, "package-ecosystem"]`), not only at the one it
# rewrote, so the items written after a rollback do not break it one by one.

Pattern = tuple  # an instance path with each array index as None (any item)
_QUOTE, _BACKSLASH, _SPACE = 0x22, 0x5C, frozenset(b" \t\n\r")


def item_pattern(path: tuple) -> Pattern | None:
    """`path` with its array indexes as None; None where it holds no index (one place only)."""
    if not any(isinstance(p, int) for p in path):
        return None
    return tuple(None if isinstance(p, int) else p for p in path)


def matches(pattern: Pattern, path: tuple) -> bool:
    return len(pattern) == len(path) and all(
        isinstance(p, int) if want is None else p == want for want, p in zip(pattern, path)
    )


def open_value(text: bytes) -> tuple[tuple, bytes] | None:
    """(instance path, the text before it) of the JSON value being written at the end of `text`:
    a string or scalar begun, or a value about to begin (after `:`, `[`, an array's `,`, or at
    the very start; right after a name, `text` and the colon, since one token may write `":"x`);
    None elsewhere (inside a name, after a value)."""
    stack: list[list] = []  # per open container: [is an object, name or index, a name comes next]
    mode, start, escaped, expect = 0, -1, False, True  # mode: 0 between, 1 string, 2 name, 3 scalar
    named = False  # a name is written, its colon not yet
    for i, c in enumerate(text):
        if mode in (1, 2):
            if escaped:
                escaped = False
            elif c == _BACKSLASH:
                escaped = True
            elif c == _QUOTE:
                if mode == 2:
                    named = True
                    try:
                        stack[-1][1] = json.loads(text[start : i + 1])
                    except ValueError:
                        stack[-1][1] = text[start + 1 : i].decode("utf-8", "replace")
                mode, expect = 0, False
            continue
        if mode == 3:
            if c in SCALAR:
                continue
            mode, expect = 0, False
        if c in _SPACE:
            continue
        top = stack[-1] if stack else None
        if c == _QUOTE:
            if top is not None and top[0] and top[2]:
                mode, top[2] = 2, False
            else:
                mode = 1
            start = i
        elif c == 0x7B:  # {
            stack.append([True, None, True])
            expect = False
        elif c == 0x5B:  # [
            stack.append([False, 0, False])
            expect = True
        elif c == 0x3A:  # :
            expect, named = True, False
        elif c == 0x2C and top is not None:  # ,
            if top[0]:
                top[2], expect = True, False
            else:
                top[1] += 1
                expect = True
        elif c in b"}]" and top is not None:
            stack.pop()
            expect = False
        elif c in SCALAR:
            mode, start = 3, i
    path = tuple(f[1] for f in stack)
    if mode in (1, 3):
        return path, text[:start]
    if mode == 0 and expect:
        return path, text
    return (path, text + b":") if mode == 0 and named else None


def held_open(text: bytes, held: list[tuple[int, bytes, Family]], items: dict[Pattern, Family]) -> bool:
    """Whether a value held at a place (`RollbackCheck.held`: (cut, text before it, family)) or at
    an item place (`items`) is open at the end of `text`, or `text` is on its way to one."""
    located = open_value(text)
    if located is not None and any(matches(p, located[0]) for p in items):
        return True
    before = None if located is None else located[1]
    return any(len(text) >= cut and (prefix.startswith(text) or prefix == before) for cut, prefix, _ in held)
