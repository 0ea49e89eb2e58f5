"""Strings held to what llguidance's regex algebra writes: lookaheads, and `not` about strings.

Neither engine's JSON-schema compiler has lookaround or a `not` about values. But llguidance's
Lark grammars intersect (`&`) and complement (`~`) regexes, which says both (#16):

- a pattern anchored at the start whose lookaheads all come first, `^(?=A)(?!B)R$`, is the
  strings matching R, with A as a prefix and not B: `^(?!@@)[\\w@]+$` is `/[\\w@]+/ & ~/@@(?s:.*)/`.
  Other lookaround (lookbehind, or a lookahead after the first character) is refused as before
  (grammar/validation/regex_check.py);
- a string's `not` of patterns or listed strings (`not: {pattern: "<<.*>>"}`, `not: {enum:
  ["default"]}`, an `anyOf` of these), SchemaStore's way to keep template syntax or reserved words
  out, is the complement of the strings they describe.

Such a schema is written as a Lark grammar (`lark_grammar`): each such string node becomes a
terminal; the objects and arrays on the way to it are written as Lark rules (properties in their
declared order, the optional ones skippable, objects closed: additionalProperties false);
everything else is embedded whole as `%json {...}` with the root's `$defs`, compiled by
llguidance's own JSON-schema compiler, compact as elsewhere. A shape this does not cover (an
`anyOf` above such a string, say) is a ValueError, which llguidance_refusal reports, and strict
mode then refuses the schema naming the keyword.

The strings of such a terminal are printable ASCII without `"` and `\\`: with no escapes the JSON
text is the value, so the regexes apply to it as written, and Python's `re` (which validates the
output) agrees with llguidance's on every class there (`\\w`, `\\d`, `\\s`, `.`). Values are thus a
subset of what the schema allows: every one of them is valid.

For xgrammar (best effort, or strict with check-and-roll-back keeping the whole pattern)
`without_lookaheads` keeps just `^R$`, a superset, which validation after generation checks. A
`patternProperties` name pattern of this form is only ever written so: neither engine's name
regexes have lookaheads (issue #42).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Iterator

from grammar.schema.walk import iter_subschemas, resolve_local_ref, rewrite_bottom_up

LOOKAROUND = re.compile(r"\(\?<?[=!]")
TEXT_CHARS = r"[ !#-\[\]-~]"  # printable ASCII but `"` and `\`: what such a string may hold
ANY = "(?s:.*)"
COMPACT = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}
ANNOTATIONS = frozenset(
    {
        "title",
        "description",
        "default",
        "examples",
        "$comment",
        "deprecated",
        "readOnly",
        "writeOnly",
        "$id",
        "$schema",
        "$anchor",
        "$defs",
        "definitions",
    }
)
STRING_KEYS = frozenset({"type", "pattern", "minLength", "maxLength", "not"})
META = set("\\.+*?()|[]{}^$#&-~/")  # escaped in a literal string's regex
OBJECT_KEYS = frozenset({"type", "properties", "required", "additionalProperties"})
ARRAY_KEYS = frozenset({"type", "items", "minItems", "maxItems"})


@dataclass(frozen=True)
class Lookaheads:
    """`^(?=A)…(?!B)…R$` taken apart: `required` As, `forbidden` Bs, the `body` R, and whether
    the pattern ended with `$` (else anything may follow R)."""

    required: tuple[str, ...]
    forbidden: tuple[str, ...]
    body: str
    to_end: bool

    def without(self) -> str:
        """The pattern without its lookaheads: every string it matches, and more."""
        return "^" + self.body + ("$" if self.to_end else "")

    def parts(self) -> tuple[list[str], list[str]]:
        """Whole-string regexes the pattern's strings match, and those they must not."""
        return (
            [_whole(self.body, self.to_end), *(_whole(*_ends(a)) for a in self.required)],
            [_whole(*_ends(b)) for b in self.forbidden],
        )


def leading_lookaheads(pattern: Any) -> Lookaheads | None:
    """`pattern` as a Lookaheads, or None if it has no lookahead or one this form cannot hold."""
    if not isinstance(pattern, str) or not pattern.startswith("^"):
        return None
    required, forbidden, i = [], [], 1
    while pattern.startswith(("(?=", "(?!"), i):
        end = _group_end(pattern, i)
        if end is None:
            return None
        (required if pattern[i + 2] == "=" else forbidden).append(pattern[i + 3 : end])
        i = end + 1
    body = pattern[i:]
    to_end = body.endswith("$") and not _escaped(body, len(body) - 1)
    if to_end:
        body = body[:-1]
    if not (required or forbidden) or any(LOOKAROUND.search(p) for p in (*required, *forbidden, body)):
        return None
    if _top_level_bar(body):  # `^(?!x)a|b$` is `^(?!x)a` or `b$`: not one intersection
        return None
    return Lookaheads(tuple(required), tuple(forbidden), body, to_end)


def excluded_strings(not_value: Any) -> list[str] | None:
    """Whole-string regexes of what a string's `not: not_value` excludes, when it is patterns or
    listed strings (None: another `not`, which this module does not write)."""
    if not isinstance(not_value, dict) or not_value.get("type", "string") != "string":
        return None
    keys = set(not_value) - {"type"} - ANNOTATIONS
    if keys == {"anyOf"} and isinstance(not_value["anyOf"], list) and not_value["anyOf"]:
        out: list[str] = []
        for branch in not_value["anyOf"]:
            got = excluded_strings(branch)
            if got is None:
                return None
            out += got
        return out
    if keys == {"pattern"}:
        return search_regexes(not_value["pattern"])
    listed = [not_value["const"]] if keys == {"const"} else not_value.get("enum") if keys == {"enum"} else None
    if not isinstance(listed, list) or not listed or not all(isinstance(v, str) for v in listed):
        return None
    return ["".join("\\" + c if c in META else c for c in v) for v in listed]


def search_regexes(pattern: Any) -> list[str] | None:
    """Whole-string regexes, one per top-level alternative, of the strings in which `pattern`
    finds a match (JSON Schema's patterns search; `^` and `$` anchor); None for lookaround or an
    anchor elsewhere than at a branch's ends."""
    if not isinstance(pattern, str) or LOOKAROUND.search(pattern):
        return None
    out = []
    for branch in _top_level_branches(pattern):
        start = branch.startswith("^")
        end = branch.endswith("$") and not _escaped(branch, len(branch) - 1)
        inner = branch[1 if start else 0 : len(branch) - 1 if end else len(branch)]
        if _has_anchor(inner):
            return None
        out.append(("" if start else ANY) + f"(?:{inner})" + ("" if end else ANY))
    return out


def string_terminal(node: dict) -> str | None:
    """The Lark terminal of a JSON string valid under `node` (type string, with a lookahead
    pattern or a `not` of patterns or listed strings); None where `node` is not such a string."""
    if node.get("type") != "string" or not set(node) - ANNOTATIONS <= STRING_KEYS:
        return None
    form = leading_lookaheads(node.get("pattern"))
    excluded = excluded_strings(node["not"]) if "not" in node else []
    if excluded is None or (form is None and not excluded):
        return None
    if form is not None:
        matched, unmatched = form.parts()
    elif "pattern" in node:
        branches = search_regexes(node["pattern"])
        if branches is None:
            return None
        matched, unmatched = ["|".join(f"(?:{b})" for b in branches)], []
    else:
        matched, unmatched = [], []
    unmatched += [f"(?:{e})" for e in excluded]
    lo, hi = node.get("minLength"), node.get("maxLength")
    if lo is not None or hi is not None:
        matched.append(f"(?s:.){{{lo or 0},{'' if hi is None else hi}}}")
    regexes = [f"/{TEXT_CHARS}*/", *map(_regex, matched), *("~" + _regex(r) for r in unmatched)]
    return '"\\"" (' + " & ".join(regexes) + ') "\\""'


def needs_lark(node: Any) -> bool:
    """Whether `node` itself is a string only the Lark form writes exactly."""
    return isinstance(node, dict) and (
        leading_lookaheads(node.get("pattern")) is not None
        or ("not" in node and excluded_strings(node["not"]) is not None)
    )


def schema_needs_lark(schema: Any) -> bool:
    return any(needs_lark(node) for node, _ in iter_subschemas(schema))


def without_lookaheads(schema: Any) -> Any:
    """`schema` with each such pattern's lookaheads dropped (for xgrammar, whose regexes have none:
    in best effort, or with check-and-roll-back keeping the whole pattern), in `pattern` and in
    `patternProperties` names (which no engine's mask writes with lookaheads)."""

    def drop(node: dict) -> dict:
        form = leading_lookaheads(node.get("pattern"))
        if form is not None:
            node = {**node, "pattern": form.without()}
        names = node.get("patternProperties")
        if isinstance(names, dict) and any(leading_lookaheads(k) is not None for k in names):
            node = {**node, "patternProperties": _names_without_lookaheads(names)}
        return node

    return rewrite_bottom_up(schema, drop)


def _names_without_lookaheads(names: dict) -> dict:
    out: dict = {}
    for key, sub in names.items():
        form = leading_lookaheads(key)
        if form is not None:
            key = form.without()
            if key in names or key in out:  # `^(?!x)[a-z]+$` beside `^[a-z]+$`: the same names, kept apart
                key = f"^(?:{form.body})" + ("$" if form.to_end else "")
        out[key] = sub
    return out


def lark_grammar(schema: Any) -> str:
    """The Lark grammar of compact JSON matching `schema` (see the module docstring); a
    ValueError names what it does not cover."""
    return _Writer(schema).grammar()


class _Writer:
    def __init__(self, root: Any):
        self.root = root
        self.defs = {
            k: root[k] for k in ("$defs", "definitions") if isinstance(root, dict) and isinstance(root.get(k), dict)
        }
        self.lines: list[str] = []

    def grammar(self) -> str:
        start = self.value(self.root, "", ())
        return "\n".join([f"start: {start}", *self.lines]) + "\n"

    def _rule(self, body: str, terminal: bool = False) -> str:
        name = f"{'LOOKAHEAD' if terminal else 'node'}_{len(self.lines)}"
        self.lines.append(f"{name}: {body}")
        return name

    def _holds_lark_string(self, node: Any, refs: tuple[str, ...]) -> bool:
        if not isinstance(node, (dict, list)):
            return False
        if isinstance(node, list):
            return any(self._holds_lark_string(v, refs) for v in node)
        if needs_lark(node):
            return True
        ref = node.get("$ref")
        if isinstance(ref, str) and ref not in refs:
            target = resolve_local_ref(self.root, ref)
            if target is not None and self._holds_lark_string(target, (*refs, ref)):
                return True
        return any(
            self._holds_lark_string(v, refs)
            for k, v in node.items()
            if k not in ("$defs", "definitions", "enum", "const", "default", "examples")
        )

    def value(self, node: Any, where: str, refs: tuple[str, ...]) -> str:
        if not self._holds_lark_string(node, refs):
            embedded = {**node, **self.defs} if isinstance(node, dict) else node
            if isinstance(embedded, dict):
                embedded["x-guidance"] = COMPACT
            else:
                embedded = {"anyOf": [embedded], "x-guidance": COMPACT}  # a boolean schema
            return self._rule("%json " + json.dumps(embedded))
        keys = set(node) - ANNOTATIONS
        if "$ref" in node:
            if keys != {"$ref"} or node["$ref"] in refs:
                raise ValueError(
                    f"a lookahead pattern or a string's `not` under {where or '/'} is reached through a "
                    "$ref with siblings or through recursion"
                )
            return self.value(resolve_local_ref(self.root, node["$ref"]), where, (*refs, node["$ref"]))
        kind = node.get("type")
        terminal = string_terminal(node)
        if terminal is not None:
            return self._rule(terminal, terminal=True)
        if kind == "object" and keys <= OBJECT_KEYS and node.get("additionalProperties") is False:
            return self._object(node, where, refs)
        if kind == "array" and keys <= ARRAY_KEYS and isinstance(node.get("items"), (dict, bool)):
            return self._array(node, where, refs)
        raise ValueError(
            f"a lookahead pattern or a string's `not` under {where or '/'} sits in a "
            f"{'node with ' + ', '.join(sorted(keys)) if keys else 'node'}: only closed objects and "
            "arrays may be on the way to it, and it must be a string of type string with no keywords "
            "but pattern, minLength, maxLength and not"
        )

    def _object(self, node: dict, where: str, refs: tuple[str, ...]) -> str:
        props = node.get("properties") or {}
        required = set(node.get("required") or ())
        if not required <= set(props):
            raise ValueError(f"{where or '/'} requires names it does not declare")
        members = []
        for name, sub in props.items():
            if not re.fullmatch(TEXT_CHARS + "*", name):
                raise ValueError(f"property name {name!r} at {where or '/'} needs escaping in the lookahead form")
            pair = self._rule(f'"\\"{name}\\":" ' + self.value(sub, f"{where}/properties/{name}", refs))
            members.append((pair, name in required))
        if not members:
            return self._rule('"{" "}"')
        # first_k: members k.. when none was written yet; after them, each one comes with its comma
        first = None
        for k in range(len(members) - 1, -1, -1):
            pair, needed = members[k]
            after = " ".join(f'"," {p}' if need else f'("," {p})?' for p, need in members[k + 1 :])
            here = f"{pair} {after}".strip()
            first = self._rule(here if needed or first is None else f"{here} | {first}")
        optional = not any(need for _, need in members)
        return self._rule(f'"{{" {first}{"?" if optional else ""} "}}"')

    def _array(self, node: dict, where: str, refs: tuple[str, ...]) -> str:
        item = self.value(node["items"], f"{where}/items", refs)
        lo, hi = int(node.get("minItems", 0)), node.get("maxItems")
        if hi is not None and int(hi) < lo:
            raise ValueError(f"{where or '/'} allows no array (maxItems below minItems)")
        if hi == 0:
            return self._rule('"[" "]"')
        more = "*" if hi is None and lo <= 1 else f"{{{max(lo - 1, 0)},{'' if hi is None else int(hi) - 1}}}"
        items = f'{item} ("," {item}){more}'
        return self._rule(f'"[" {items} "]"' if lo > 0 else f'"[" ({items})? "]"')


def _regex(text: str) -> str:
    """`text` as a Lark regex literal (`/` escaped)."""
    out, escaped = [], False
    for ch in text:
        out.append("\\/" if ch == "/" and not escaped else ch)
        escaped = ch == "\\" and not escaped
    return "/" + "".join(out) + "/"


def _ends(part: str) -> tuple[str, bool]:
    """A lookahead's regex, and whether it ends with `$` (then it spans the whole string)."""
    if part.endswith("$") and not _escaped(part, len(part) - 1):
        return part[:-1], True
    return part, False


def _whole(regex: str, to_end: bool) -> str:
    """The regex of whole strings that `regex` matches a prefix of (all of, with `to_end`)."""
    return f"(?:{regex})" if to_end else f"(?:{regex}){ANY}"


def _escaped(text: str, i: int) -> bool:
    backslashes = 0
    while i - 1 - backslashes >= 0 and text[i - 1 - backslashes] == "\\":
        backslashes += 1
    return backslashes % 2 == 1


def _outside_classes(pattern: str, start: int = 0) -> Iterator[tuple[int, str, int]]:
    """(index, character, group depth before it) of each unescaped character of `pattern` from
    `start` that stands outside a character class: the regex's structure, for the scans below."""
    depth, in_class, i = 0, False, start
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\":
            i += 2
            continue
        if in_class:
            in_class = ch != "]"
        elif ch == "[":
            in_class = True
        else:
            yield i, ch, depth
            depth += (ch == "(") - (ch == ")")
        i += 1


def _group_end(pattern: str, start: int) -> int | None:
    """Index of the `)` closing the group that opens at `start` (None if unbalanced)."""
    return next((i for i, ch, depth in _outside_classes(pattern, start) if ch == ")" and depth == 1), None)


def _top_level_bar(pattern: str) -> bool:
    return len(_top_level_branches(pattern)) > 1


def _top_level_branches(pattern: str) -> list[str]:
    """`pattern` split at the `|`s outside groups and classes."""
    bars = [i for i, ch, depth in _outside_classes(pattern) if ch == "|" and depth == 0]
    return [pattern[a + 1 : b] for a, b in zip([-1, *bars], [*bars, len(pattern)])]


def _has_anchor(regex: str) -> bool:
    """An unescaped `^` or `$` outside a character class."""
    return any(ch in "^$" for _, ch, _ in _outside_classes(regex))
