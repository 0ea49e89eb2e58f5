"""Check-and-roll-back: schema keywords no token mask enforces, kept by checking the finished
output and rewriting the value that breaks them.

For a JSON schema whose fidelity report leaves keywords `checked` (an overlapping `oneOf`, a
general `if`/`then`/`else`, `patternProperties`, a `format` no mask spells, ...), the matcher
carries a `RollbackCheck`. When the output is whole (the stop token accepted) the matcher asks
for its verdict: the text is validated with jsonschema (formats checked); for tool calls
(`ToolCallRollbackRules`) each call's arguments are validated against its function's parameters,
the calls found by their opening marker and their values told apart by the call's index. On a
violation

1. the failing value is found: the value at the error's instance path (of several errors, the one
   that starts last in the text, so the least is rewritten; for `uniqueItems`, the first item
   equal to an earlier one). An object name written twice counts as a failing value too (the
   value check masks most repeats; this catches the rest where the output is checked anyway):
   it is rewritten from its opening quote, with the same name banned there;
2. the matcher rolls back to the token where the rewrite begins (the runtime drops those tokens
   and their KV slots), and the text up to the value's end is remembered as a failed path. An
   object or array that fails for the first time is reopened at its closing bracket where the
   grammar lets it go on there: what breaks a container's keywords (`required` under `then`,
   `dependentRequired`, `contains`, `oneOf` between object shapes) is mostly something missing, so
   the rewrite goes on writing it. A scalar, or a container failing again or that the grammar must
   close there (its properties written in declared order), is rewritten from its first token;
3. from then on the mask loses every token that would write the same value again: along a failed
   path, the tokens that stay on it (or complete the same value) are banned, unless that would
   leave no token at all (the grammar forces that text there). The rewritten value therefore
   parts from the failed one at the first place where the grammar leaves a choice: the model's
   next-best choice there, then its own continuation;
4. a value rewritten from its start is also held to the family of values the keyword it broke
   still allows there (grammar/checks/value_family.py: the listed values of an `enum` or `const`,
   the opening of a `type`), where the grammar allows any of them: so a rewrite does not write the
   next value of the same failing kind, it converges. Inside an array item the family is held at
   that place in every item (`updates[*].package-ecosystem`): the items written after the
   rollback are held too, not mended one rewrite each.

At most `max_retries` rewrites per output; after that the verdict is `EXHAUSTED` and the output is
left as it is (the runtime fails a strict request rather than send a value that breaks its
schema; best effort sends it, flagged invalid by validation after generation). A runtime that
rolls back must not have sent the output yet: requests with this check are streamed whole, at the
end (`withholds_output`).

Only the accepted text is kept here; the check costs nothing per token until a path has failed.
"""

from __future__ import annotations

import json
import re
import threading
from typing import Any, Callable

import jsonschema
import numpy as np

from grammar.checks.value_family import (
    Family,
    combine,
    error_family,
    family_candidates,
    held_open,
    item_pattern,
    matches,
    open_value,
)
from grammar.engines.token_mask import allowed_among, allowed_ids

DEFAULT_VALUE_RETRIES = 4  # rewrites per output (`--value-retries`)
EXHAUSTED = -1  # the verdict when the output still fails and no rewrite is left
_WHITESPACE = b" \t\n\r"
_SCALAR = frozenset(b"0123456789+-.eEtrufalsn")  # what numbers, true, false and null are made of
_INDEXED_PREFIX = 4  # tokens are indexed by their first bytes up to this length


def schema_validator(schema: Any) -> Any:
    """A jsonschema validator for `schema` (dialect from `$schema`, formats checked): what the
    finished output is checked with here and validated with after generation (gateway)."""
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


class RollbackVocab:
    """Token texts indexed by their whole text and by their leading bytes, built on first use (one
    per vocabulary: the server builds none until a schema that needs them compiles)."""

    def __init__(self, texts: list[bytes]) -> None:
        self.texts = texts
        self.longest = max(map(len, texts), default=0)
        self._by_text: dict[bytes, list[int]] | None = None
        self._by_prefix: dict[bytes, np.ndarray] | None = None
        self._lock = threading.Lock()

    def exactly(self, text: bytes) -> list[int]:
        """Ids of the tokens whose text is `text`."""
        self.index()
        return self._by_text.get(text, [])

    def starting_with(self, prefix: bytes) -> np.ndarray:
        """Ids of the tokens whose text starts with `prefix` (non-empty)."""
        found = self.index().get(prefix[:_INDEXED_PREFIX])
        if found is None:
            return np.zeros(0, dtype=np.int64)
        if len(prefix) <= _INDEXED_PREFIX:
            return found
        return np.array([i for i in found.tolist() if self.texts[i].startswith(prefix)], dtype=np.int64)

    def index(self) -> dict[bytes, np.ndarray]:
        """Build the index now if not yet (it walks the whole vocabulary: call it at compile, not mid-answer)."""
        with self._lock:
            if self._by_prefix is None:
                lists, whole = {}, {}  # (text or prefix) -> ids
                for i, text in enumerate(self.texts):
                    if text:
                        whole.setdefault(text, []).append(i)
                    for k in range(1, min(len(text), _INDEXED_PREFIX) + 1):
                        lists.setdefault(text[:k], []).append(i)
                self._by_text = whole
                self._by_prefix = {k: np.array(v, dtype=np.int64) for k, v in lists.items()}
            return self._by_prefix


Failure = tuple[int, int, "tuple | None"]  # (start, end) of a value to rewrite, its path (None: a repeated name)
# a failure and the family of values its keyword allows there (grammar/checks/value_family.py), or None
Checked = tuple[int, int, "tuple | None", "Family | None"]


class RollbackRules:
    """What every output of one schema is checked against (shared by its matchers)."""

    item_places = True  # the output is one JSON value: a family is held at every item's place

    def __init__(self, schema: Any, vocab: RollbackVocab, max_retries: int) -> None:
        self.validator = schema_validator(schema)
        self.vocab, self.max_retries = vocab, max_retries

    def failures(self, data: bytes) -> list[Failure] | None:
        """Every value of the output `data` that breaks the schema, and every repeated name; None
        when `data` is not JSON (the grammar's business; validation after generation reports it)."""
        found = self.checked(data)
        return None if found is None else [f[:3] for f in found]

    def checked(self, data: bytes) -> list[Checked] | None:
        """`failures`, each with the family of values its keyword allows at that value."""
        try:
            value = json.loads(data)
        except (ValueError, RecursionError):
            return None
        spans, repeats = scan_json(data)
        return [_failure(spans, e) for e in self.validator.iter_errors(value)] + [
            (s, e, None, None) for s, e in repeats
        ]


class ToolCallRollbackRules(RollbackRules):
    """The same for tool calls: each call's arguments (`<tool_call>{"name":…,"arguments":{…}}`) are
    checked against its function's parameters, the calls' values told apart by the call's index."""

    item_places = False  # paths count calls, not places in one JSON text

    def __init__(self, parameters: dict[str, Any], call_begin: str, vocab: RollbackVocab, max_retries: int) -> None:
        self.validators = {name: schema_validator(schema) for name, schema in parameters.items()}
        self.call_begin = call_begin.encode()
        self.vocab, self.max_retries = vocab, max_retries

    def checked(self, data: bytes) -> list[Checked] | None:
        found: list[Checked] = []
        index, at = 0, data.find(self.call_begin)
        while at >= 0:
            start = at + len(self.call_begin)
            try:
                spans, repeats = scan_json(data[start:])
                whole = spans[()]
                call = json.loads(data[start + whole[0] : start + whole[1]])
            except (ValueError, IndexError, KeyError, RecursionError):
                return None  # a call that is not whole JSON: the grammar's business
            validator = self.validators.get(call.get("name")) if isinstance(call, dict) else None
            if validator is not None and "arguments" in call:
                for error in validator.iter_errors(call["arguments"]):
                    s, e, path, family = _failure(spans, error, ("arguments",))
                    found.append((start + s, start + e, (index,) + path, family))
            found += [(start + s, start + e, None, None) for s, e in repeats]
            index, at = index + 1, data.find(self.call_begin, start + whole[1])
        return found


class TagCallRollbackRules(RollbackRules):
    """The same for a model format whose calls are `header NAME ... {arguments}` (tag_format.py):
    `header` is a bytes regex of a call's header, each alternative naming the tool in a group,
    ending where the arguments object starts."""

    item_places = False

    def __init__(self, parameters: dict[str, Any], header: re.Pattern[bytes], vocab: RollbackVocab, max_retries: int):
        self.validators = {name: schema_validator(schema) for name, schema in parameters.items()}
        self.header = header
        self.vocab, self.max_retries = vocab, max_retries

    def checked(self, data: bytes) -> list[Checked] | None:
        found: list[Checked] = []
        for index, m in enumerate(self.header.finditer(data)):
            start = m.end()
            name = next((v for v in m.groupdict().values() if v), b"").decode("utf-8", "replace")
            try:
                spans, repeats = scan_json(data[start:])
                whole = spans[()]
                args = json.loads(data[start + whole[0] : start + whole[1]])
            except (ValueError, IndexError, KeyError, RecursionError):
                return None  # arguments that are not whole JSON: the grammar's business
            validator = self.validators.get(name)
            if validator is not None:
                for error in validator.iter_errors(args):
                    s, e, path, family = _failure(spans, error)
                    found.append((start + s, start + e, (index,) + path, family))
            found += [(start + s, start + e, None, None) for s, e in repeats]
        return found


class RollbackCheck:
    """The check's state for one output (one per request, beside its grammar matcher)."""

    __slots__ = ("_rules", "_text", "_starts", "failed", "retries", "_reopened", "held", "held_items")

    def __init__(self, rules: RollbackRules) -> None:
        self._rules = rules
        self._text = bytearray()  # the accepted text
        self._starts: list[int] = []  # the text's length before each accepted token
        self.failed: list[tuple[int, bytes]] = []  # (value's start offset, text up to the value's end)
        self.retries = 0
        self._reopened: set[tuple] = set()  # containers already rewritten from their closing bracket
        # (where its rewrite began, the text before a rewritten value, the family it is held to)
        self.held: list[tuple[int, bytes, Family]] = []
        self.held_items: dict[tuple, Family] = {}  # item places (value_family.item_pattern) and their family

    # -- following the output ------------------------------------------------------------

    def accept(self, token_id: int) -> None:
        self._starts.append(len(self._text))
        self._text += self._rules.vocab.texts[token_id]

    def rollback(self, num_tokens: int) -> None:
        if num_tokens > 0:
            cut = self._starts[-num_tokens]
            del self._starts[-num_tokens:]
            del self._text[cut:]

    @property
    def text(self) -> bytes:
        return bytes(self._text)

    @property
    def tokens(self) -> int:  # how many accepted tokens a rollback may take back
        return len(self._starts)

    def spelled(self, token_id: int) -> bytes:
        return self._rules.vocab.texts[token_id]

    @property
    def holds(self) -> bool:  # some value is held to a family (completion plans then honour it)
        return bool(self.held or self.held_items)

    # -- the verdict ---------------------------------------------------------------------

    def verdict(self, extends: Callable[[int, bytes], bool] | None = None) -> int | None:
        """For a whole output: None if it fits the schema; else how many of the accepted tokens
        to roll back to rewrite the failing value (the caller rolls them back, this check's
        included), or EXHAUSTED when the rewrites are spent (nothing is rolled back). `extends(n,
        text)`: may the grammar write anything but a bracket after rolling back n tokens and writing
        `text`? (One it must close there is rewritten from its start at once, not reopened.)"""
        data = bytes(self._text)
        candidates = self._rules.checked(data)
        if not candidates:
            return None
        if self.retries >= self._rules.max_retries:
            return EXHAUSTED
        # the value that starts last is rewritten (a repeated name from its opening quote, the same
        # name banned there)
        start, end, path, _ = max(candidates, key=lambda s: s[:2])
        whole = start
        if path is not None and data[end - 1] in b"}]" and path not in self._reopened:
            self._reopened.add(path)
            at = _token_at(self._starts, end - 1)
            if extends is None or extends(len(self._starts) - at, data[self._starts[at] : end - 1]):
                start = end - 1
        self.retries += 1
        self.failed.append((start, data[:end]))
        first = _token_at(self._starts, start)
        if start == whole:
            # written again from its start: held to what every keyword it broke there allows
            family = combine(c[3] for c in candidates if c[:2] == (start, end) and c[3] is not None)
            if family:
                self.held.append((self._starts[first], data[:start], family))
        if self._rules.item_places:
            self._hold_items(candidates)
        return len(self._starts) - first

    def _hold_items(self, candidates: list[Checked]) -> None:
        """Hold every failing item value's family at its place in every item (module docstring)."""
        for _, _, path, family in candidates:
            # outside arrays at its own path: a rollback past its start (strict.py's room) keeps it
            pattern = (item_pattern(path) or path) if path is not None and family else None
            if pattern is not None:
                both = combine([self.held_items[pattern], family]) if pattern in self.held_items else family
                if both:
                    self.held_items[pattern] = both

    # -- the mask ------------------------------------------------------------------------

    def ban(self, bitmask, row: int) -> int:
        """Clear in `bitmask[row]` the tokens that would write a failed value again (see the module
        docstring); returns how many (0 also when banning would leave no token)."""
        if not self.failed:
            return 0
        words = bitmask[row].numpy().view(np.uint32)
        held = self._hold(words)
        ids = np.unique(
            np.concatenate([_NONE] + [self._repeating(s, failed, words) for s, failed in self.failed if s not in held])
        )
        if not len(ids):
            return 0
        kept = words.copy()
        np.bitwise_and.at(words, ids >> 5, ~(np.uint32(1) << (ids & 31).astype(np.uint32)))
        if not words.any():  # the grammar forces this text: part from the failed value further on
            words[:] = kept
            return 0
        return len(ids)

    def _places(self, text: bytes) -> list[tuple[bytes, Family]]:
        """(text before the value, family) of each held value that may be open at the end of `text`."""
        # (a held value rolled back before its rewrite began: the text may take another way)
        places = [(prefix, f) for cut, prefix, f in self.held if len(text) >= cut]
        located = open_value(text) if self.held_items else None
        if located is not None:
            path, before = located
            places += [(before, f) for pattern, f in self.held_items.items() if matches(pattern, path)]
        return places

    def may_hold(self, text: bytes) -> bool:
        """Whether a held family may narrow the mask after `text` (no mask needed)."""
        return self.holds and held_open(text, self.held, self.held_items)

    def _hold(self, words: np.ndarray, text: bytes | None = None) -> set[int]:
        """Keep in `words` only the tokens that write a held value as its family allows (where any
        allowed token does: else the grammar cannot write the family there, and the mask stands).
        Returns the start offsets of the values so held: their failed text, outside the family,
        needs no ban of its own (which would also ban a listed value sharing its first letters).
        `text`: the output the mask follows (a plan's, strict.py), the accepted text by default."""
        held: set[int] = set()
        text = bytes(self._text) if text is None else text
        for prefix, family in self._places(text):
            ids = family_candidates(prefix, family, text, self._rules.vocab, words)
            if ids is None or not len(ids):
                continue
            ids = allowed_among(words, ids)
            if len(ids):
                words[:] = 0
                np.bitwise_or.at(words, ids >> 5, np.uint32(1) << (ids & 31).astype(np.uint32))
                held.add(len(prefix))
        return held

    def hold(self, words: np.ndarray, text: bytes) -> bool:
        """`_hold` after `text` (a completion plan's way, strict.py): whether it narrowed `words`."""
        return bool(self._hold(words, text))

    def _repeating(self, start: int, failed: bytes, words: np.ndarray) -> np.ndarray:
        """The allowed tokens after which the text would still run along `failed` past `start`, or
        complete the same value."""
        done = len(self._text)
        if done >= len(failed) and not (done == len(failed) and failed[-1] in _SCALAR):
            return _NONE
        if not failed.startswith(self._text):
            return _NONE
        rest = failed[done:]
        vocab = self._rules.vocab
        scalar_end = failed[-1] in _SCALAR  # a number or literal ends only at the byte after it
        found: list[int] = []
        if rest:
            # tokens that are a prefix of the rest and reach past the value's start
            for k in range(max(1, start - done + 1), min(len(rest) + (0 if scalar_end else 1), vocab.longest + 1)):
                found += vocab.exactly(rest[:k])
            longer = vocab.starting_with(rest)
            if scalar_end:  # the same scalar, ended by what follows it
                longer = np.array(
                    [
                        i
                        for i in longer.tolist()
                        if len(vocab.texts[i]) > len(rest) and vocab.texts[i][len(rest)] not in _SCALAR
                    ],
                    dtype=np.int64,
                )
            found += longer.tolist()
        else:  # the text is the failed scalar: ban whatever ends it here
            found = [i for i in allowed_ids(words).tolist() if vocab.texts[i] and vocab.texts[i][0] not in _SCALAR]
        ids = np.array(found, dtype=np.int64)
        return allowed_among(words, ids) if len(ids) else _NONE


_NONE = np.zeros(0, dtype=np.int64)


def _token_at(starts: list[int], offset: int) -> int:
    """Index of the accepted token whose text holds byte `offset` (the last token starting at or
    before it)."""
    lo, hi = 0, len(starts)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if starts[mid] <= offset:
            lo = mid
        else:
            hi = mid
    return lo


def _failing_path(error: jsonschema.ValidationError) -> tuple:
    """The instance path of the value to rewrite for `error`: its own value, except that a
    `uniqueItems` error names the first item equal to an earlier one (rewriting that item is
    enough)."""
    path = tuple(error.absolute_path)
    if error.validator == "uniqueItems" and isinstance(error.instance, list):
        seen: list = []
        for index, item in enumerate(error.instance):
            if any(jsonschema._utils.equal(item, other) for other in seen):
                return path + (index,)
            seen.append(item)
    return path


def _failure(spans: dict[tuple, tuple[int, int]], error: jsonschema.ValidationError, above: tuple = ()) -> Checked:
    """(start, end, path, family) of the value `error` names (under `above` in the text): the
    family only where that very value was found (not an enclosing one) and the error is its own."""
    wanted = above + _failing_path(error)
    start, end, path = _span(spans, wanted)
    own = path == wanted and tuple(error.absolute_path) == wanted[len(above) :]
    return start, end, path, error_family(error.validator, error.validator_value) if own else None


def _span(spans: dict[tuple, tuple[int, int]], path: tuple) -> tuple[int, int, tuple]:
    """(start, end, path) of the value at `path`, or of its nearest enclosing value found."""
    while path not in spans and path:
        path = path[:-1]
    return (*spans.get(path, (0, 0)), path)


def value_spans(data: bytes) -> dict[tuple, tuple[int, int]]:
    """(start, end) byte offsets of every value in the JSON text `data`, by instance path
    (names decoded, array indexes as ints). `data` must be valid JSON."""
    return scan_json(data)[0]


def scan_json(data: bytes) -> tuple[dict[tuple, tuple[int, int]], list[tuple[int, int]]]:
    """`value_spans`, and the (start, end) of each object name that repeats an earlier name of its
    object (json.loads would keep only the last value, and jsonschema never sees the repeat)."""
    spans: dict[tuple, tuple[int, int]] = {}
    repeats: list[tuple[int, int]] = []
    n = len(data)

    def skip(i: int) -> int:
        while i < n and data[i] in _WHITESPACE:
            i += 1
        return i

    def string_end(i: int) -> int:  # data[i] is the opening quote
        i += 1
        while data[i] != 0x22:
            i += 2 if data[i] == 0x5C else 1
        return i + 1

    def value(i: int, path: tuple) -> int:
        i = skip(i)
        start, c = i, data[i]
        if c in b"{[":
            close, index = (0x7D, 0) if c == 0x7B else (0x5D, 0)
            names: set[str] = set()
            i = skip(i + 1)
            while data[i] != close:
                if c == 0x7B:
                    name_end = string_end(i)
                    key: Any = json.loads(data[i:name_end])
                    if key in names:
                        repeats.append((i, name_end))
                    names.add(key)
                    i = skip(name_end) + 1  # past the colon
                else:
                    key = index
                    index += 1
                i = skip(value(i, path + (key,)))
                if data[i] == 0x2C:
                    i = skip(i + 1)
            i += 1
        elif c == 0x22:
            i = string_end(i)
        else:
            while i < n and data[i] in _SCALAR:
                i += 1
        spans[path] = (start, i)
        return i

    try:
        value(0, ())
    except RecursionError:
        spans = {(): (skip(0), n)}
    return spans, repeats
