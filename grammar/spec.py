"""What a request asks the output to look like, in a canonical, hashable form.

A `GrammarSpec` is plain data (kind + payload); its key is the sha256 of its canonical JSON and
of the tokenizer's fingerprint, so the same schema written with keys in another order reuses the
same compiled grammar, and a grammar compiled for one vocabulary is never used with another.
"""

from __future__ import annotations

import hashlib
import json
import threading
import weakref
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal

from grammar.canonical import canonical_data, canonical_json, canonical_schema, canonical_tool
from grammar.errors import GrammarSpecError
from grammar.limits import check_json_limits

SpecKind = Literal["json_schema", "json_object", "regex", "ebnf", "tool_calls"]
SPEC_KINDS: tuple[str, ...] = ("json_schema", "json_object", "regex", "ebnf", "tool_calls")

# Which request parameter each kind comes from: where a GrammarSpecError points the client.
PARAM_OF_KIND = {
    "json_schema": "response_format",
    "json_object": "response_format",
    "regex": "regex",
    "ebnf": "ebnf",
    "tool_calls": "tools",
}


@dataclass(frozen=True, eq=False)
class GrammarSpec:
    """kind + payload; build one with the classmethods, which document each payload's shape.

    `strict` (json_schema, tool_calls): no properties beyond the declared ones wherever a schema
    declares `properties`, as OpenAI's strict mode does; without it JSON Schema's open-object
    default applies.
    """

    kind: SpecKind
    payload: Any = None
    strict: bool = True

    @classmethod
    def json_schema(cls, schema: Any, *, strict: bool = True) -> "GrammarSpec":
        return cls("json_schema", schema, strict)

    @classmethod
    def json_object(cls) -> "GrammarSpec":
        return cls("json_object", None)

    @classmethod
    def regex(cls, pattern: str) -> "GrammarSpec":
        return cls("regex", pattern)

    @classmethod
    def ebnf(cls, grammar: str) -> "GrammarSpec":
        return cls("ebnf", grammar)

    @classmethod
    def tool_calls(
        cls,
        tools: list[dict],
        tool_choice: str | dict = "auto",
        parallel_tool_calls: bool = True,
        *,
        format: str = "hermes",
    ) -> "GrammarSpec":
        """OpenAI `tools` + `tool_choice` + `parallel_tool_calls`, rendered in `format`."""
        payload = {
            "tools": tools,
            "tool_choice": tool_choice,
            "parallel_tool_calls": parallel_tool_calls,
            "format": format,
        }
        return cls("tool_calls", payload, True)

    @property
    def param(self) -> str:
        return PARAM_OF_KIND.get(self.kind, "grammar")

    @cached_property
    def canonical(self) -> str:
        """Canonical JSON of the whole spec (limits checked first, so this never recurses deep)."""
        if self.kind not in SPEC_KINDS:
            raise GrammarSpecError(f"unknown grammar kind {self.kind!r}; expected one of {', '.join(SPEC_KINDS)}")
        check_json_limits(self.payload, param=self.param)
        try:
            payload = _canonical_payload(self.kind, self.payload)
            text = canonical_json({"kind": self.kind, "payload": payload, "strict": bool(self.strict)})
        except (TypeError, ValueError) as e:  # NaN, Infinity, non-JSON Python objects
            raise GrammarSpecError(f"spec is not plain JSON data: {e}", "", self.param) from None
        check_json_limits(text, param=self.param)  # the size limit applies to the canonical text
        return text

    def key(self, tokenizer_fingerprint: str) -> str:
        """sha256 of canonical spec + tokenizer fingerprint: the cache key (memory and disk)."""
        return hashlib.sha256(f"{self.canonical}\n{tokenizer_fingerprint}".encode()).hexdigest()


def _canonical_payload(kind: str, payload: Any) -> Any:
    if kind == "json_schema":
        return canonical_schema(payload)
    if kind == "tool_calls" and isinstance(payload, dict):
        out = canonical_data(payload)
        tools = payload.get("tools")
        if isinstance(tools, list):
            out["tools"] = [canonical_tool(t) for t in tools]
        return out
    return canonical_data(payload)


# -- tokenizer fingerprint -------------------------------------------------------------------

_fingerprints: "weakref.WeakKeyDictionary[Any, str]" = weakref.WeakKeyDictionary()
_fingerprints_by_id: dict[int, tuple[Any, str]] = {}
_fingerprint_lock = threading.Lock()


def tokenizer_fingerprint(hf_tokenizer: Any) -> str:
    """sha256 over the vocabulary (token -> id) and the special/added tokens; cached per object.

    Two tokenizers with the same vocabulary and special tokens give the same fingerprint, so a
    disk cache built by one process is valid for the next.
    """
    with _fingerprint_lock:
        try:
            cached = _fingerprints.get(hf_tokenizer)
        except TypeError:  # not weak-referenceable
            entry = _fingerprints_by_id.get(id(hf_tokenizer))
            cached = entry[1] if entry and entry[0] is hf_tokenizer else None
        if cached is not None:
            return cached
    digest = _compute_fingerprint(hf_tokenizer)
    with _fingerprint_lock:
        try:
            _fingerprints[hf_tokenizer] = digest
        except TypeError:
            _fingerprints_by_id[id(hf_tokenizer)] = (hf_tokenizer, digest)
    return digest


def _compute_fingerprint(hf_tokenizer: Any) -> str:
    h = hashlib.sha256()
    vocab = hf_tokenizer.get_vocab()
    for token, idx in sorted(vocab.items(), key=lambda kv: kv[1]):
        h.update(f"{idx}\t{token}\n".encode("utf-8", "surrogatepass"))
    added = getattr(hf_tokenizer, "added_tokens_decoder", {}) or {}
    specials = sorted((int(i), str(t), bool(getattr(t, "special", False))) for i, t in added.items())
    h.update(json.dumps(specials, separators=(",", ":")).encode())
    h.update(json.dumps(sorted(getattr(hf_tokenizer, "all_special_tokens", []) or [])).encode())
    return h.hexdigest()
