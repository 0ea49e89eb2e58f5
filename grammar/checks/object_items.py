"""What keeps the items of a `uniqueItems` array unique (`ItemRule`), and for items that are closed
objects of scalar properties, which values an item being written may still end as (`ObjectItems`,
its `Field`s): the value check (value_check.py) refuses a token after which it could only equal an
earlier item. The schema side that builds these: value_rules.py.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass

from grammar.checks.canonical import canonical

ABSENT = "\x00absent"  # a property left out (never a canonical JSON text)
OPEN = object()  # ObjectItems._alive: the field may be written or left out
OBJECT_ITEM_KEYWORDS = frozenset({"type", "properties", "required", "additionalProperties"})
SCALAR_KINDS = ("string", "integer", "number")


@dataclass(frozen=True)
class Field:
    """One declared property of an object item: its name and the values the grammar may write."""

    name: str
    required: bool
    kind: str  # "string", "integer", "number" (free: unboundedly many values) or "listed"
    values: tuple[tuple[str, tuple[bytes, ...]], ...] = ()  # listed: (canonical, raw spellings)
    spellings: tuple[bytes, ...] = ()  # the name as written between its quotes

    def choices(self, raw: bytes | None = None, absent: bool = False) -> frozenset | None:
        """Canonical values the field may still take (None: unboundedly many); `raw`: the value's
        text so far (None: not started); `absent`: leaving the field out is one of them."""
        if self.kind == "listed":
            got = {c for c, spellings in self.values if raw is None or any(s.startswith(raw) for s in spellings)}
        elif self.kind == "integer" and raw in (b"0", b"-0"):
            got = {canonical(0)}  # a leading zero ends an integer
        else:
            return None  # a free string, or a number that can still grow or take a fraction
        return frozenset(got | {ABSENT} if absent and not self.required else got)


@dataclass(frozen=True)
class ObjectItems:
    """The items of a unique array are closed objects whose properties are all free scalars or
    listed values. The grammar writes the declared names in order (required ones always, optional
    ones or not), so the values an item may still end as, given what is written of it, are a
    product of per-field choices; `alive` says whether one of them differs from every earlier item."""

    fields: tuple[Field, ...]

    @functools.cached_property
    def index(self) -> dict[str, int]:
        return {f.name: i for i, f in enumerate(self.fields)}

    def size(self) -> int | None:
        """How many distinct items there are (None: unboundedly many)."""
        total = 1
        for f in self.fields:
            got = f.choices(absent=True)
            if got is None:
                return None
            total *= len(got)
        return total

    def alive(
        self,
        earlier: frozenset[str],
        done: tuple = (),
        key: str | None = None,
        raw: bytes | None = None,
        more: bool = False,
        name: bytes | None = None,
    ) -> bool:
        """Can the item still end unequal to each of `earlier` (canonical forms)? Given: `done`,
        the (name, canonical value) pairs written; `key`, the name whose value is being written
        (`raw`: its text so far, None before it starts); `more`: a comma was written, so a name
        follows; `name`: the text of the name being written."""
        if not earlier:
            return True
        index = self.index
        written = dict(done)
        if any(n not in index for n in written) or (key is not None and key not in index):
            return True  # not the grammar this model describes: claim nothing
        last = max((index[n] for n in written), default=-1)
        if key is not None and key not in written:
            return self._alive(earlier, written, index[key], self.fields[index[key]].choices(raw))
        if name is not None or more:
            return any(
                self._alive(earlier, written, j, self.fields[j].choices())
                for j in range(last + 1, len(self.fields))
                if any(s.startswith(name or b"") for s in self.fields[j].spellings)
            )
        return self._alive(earlier, written, last + 1, OPEN)

    def _alive(self, earlier, written: dict, j: int, current) -> bool:
        """Fields before `j` not written were left out; field `j` is written and takes one of
        `current` (None: unboundedly many; OPEN: written or not, like the fields after it), the
        fields after it any of theirs, absence included where optional."""
        fixed = dict(written)
        options: list[tuple[str, frozenset]] = []
        total = 1
        for i, f in enumerate(self.fields):
            if f.name in written:
                continue
            if i < j:
                if f.required:
                    return False  # a required name cannot be skipped: no item ends this way
                fixed[f.name] = ABSENT
                continue
            got = current if i == j and current is not OPEN else f.choices(absent=True)
            if got is None:
                return True  # unboundedly many values: they cannot all be taken
            if not got:
                return True  # no value fits (the grammar would not have allowed this): claim nothing
            options.append((f.name, got))
            total *= len(got)
        if total > len(earlier):
            return True
        taken = 0
        index = self.index
        for canon in earlier:
            item = _object_fields(canon)
            if item is None or any(n not in index for n in item):
                continue
            if all(item.get(n, ABSENT) == v for n, v in fixed.items()) and all(
                item.get(n, ABSENT) in got for n, got in options
            ):
                taken += 1
        return total > taken


@functools.lru_cache(maxsize=4096)
def _object_fields(canon: str) -> dict[str, str] | None:
    """An earlier item's properties as canonical texts (None: not an object)."""
    value = json.loads(canon)
    return {k: canonical(v) for k, v in value.items()} if isinstance(value, dict) else None


@dataclass(frozen=True)
class ItemRule:
    """What keeps the items of one array unique."""

    finite: tuple[tuple[str, tuple[bytes, ...]], ...] | None  # (canonical, raw spellings) of every allowed item
    integer_only: bool  # items are integers: `0` cannot grow into another number
    objects: ObjectItems | None = None  # items are closed objects of scalar properties

    def unused_spellings(self, used: frozenset[str]) -> list[bytes]:
        return [raw for canon, raws in self.finite if canon not in used for raw in raws]

    def exhausted(self, used: frozenset[str]) -> bool:
        if self.objects is not None:
            return not self.objects.alive(used)
        return self.finite is not None and all(canon in used for canon, _ in self.finite)
