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
from typing import Any

from grammar.errors import GrammarSpecError
from grammar.kinds import KINDS, kind_for
from grammar.schema.canonical import canonical_json
from grammar.schema.limits import check_json_limits


@dataclass(frozen=True, eq=False)
class GrammarSpec:
    """kind + payload; build one with `of` or the per-kind classmethods. What each kind's payload
    and `strict` mean is documented with the kind (grammar/kinds/)."""

    kind: str  # a name in grammar.kinds.KINDS
    payload: Any = None
    strict: bool = True

    @classmethod
    def of(cls, kind: str, payload: Any, strict: bool = True) -> GrammarSpec:
        """The spec of a request's constraint of `kind` (GrammarSpecError for an unknown kind)."""
        return cls(kind, *kind_for(kind).spec_fields(payload, strict))

    @classmethod
    def json_schema(cls, schema: Any, *, strict: bool = True) -> GrammarSpec:
        return cls.of("json_schema", schema, strict)

    @classmethod
    def json_object(cls) -> GrammarSpec:
        return cls.of("json_object", None)

    @classmethod
    def regex(cls, pattern: str) -> GrammarSpec:
        return cls.of("regex", pattern)

    @classmethod
    def ebnf(cls, grammar: str) -> GrammarSpec:
        return cls.of("ebnf", grammar)

    @classmethod
    def tool_calls(
        cls,
        tools: list[dict],
        tool_choice: str | dict = "auto",
        parallel_tool_calls: bool = True,
        *,
        format: str = "hermes",
    ) -> GrammarSpec:
        """OpenAI `tools` + `tool_choice` + `parallel_tool_calls`, rendered in `format`."""
        payload = {
            "tools": tools,
            "tool_choice": tool_choice,
            "parallel_tool_calls": parallel_tool_calls,
            "format": format,
        }
        return cls.of("tool_calls", payload)

    @property
    def param(self) -> str:
        kind = KINDS.get(self.kind)
        return "grammar" if kind is None else kind.param

    @cached_property
    def canonical(self) -> str:
        """Canonical JSON of the whole spec (limits checked first, so this never recurses deep)."""
        kind = kind_for(self.kind)
        check_json_limits(self.payload, param=self.param)
        try:
            payload = kind.canonical_payload(self.payload)
            text = canonical_json({"kind": self.kind, "payload": payload, "strict": bool(self.strict)})
        except (TypeError, ValueError) as e:  # NaN, Infinity, non-JSON Python objects
            raise GrammarSpecError(f"spec is not plain JSON data: {e}", "", self.param) from None
        check_json_limits(text, param=self.param)  # the size limit applies to the canonical text
        return text

    def key(self, tokenizer_fingerprint: str) -> str:
        """sha256 of canonical spec + tokenizer fingerprint: the cache key (memory and disk)."""
        return hashlib.sha256(f"{self.canonical}\n{tokenizer_fingerprint}".encode()).hexdigest()


# -- tokenizer fingerprint -------------------------------------------------------------------

_fingerprints: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
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
