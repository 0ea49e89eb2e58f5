"""Incremental detokenization that never emits half a UTF-8 character, with stop-string handling.

Special tokens are left out of the text (`skip_special_tokens`), except those a request asks to
keep (`GenerateRequest.keep_special_ids`): the markers its output format writes as special tokens
(gpt-oss's `<|channel|>`, `<|message|>`, `<|end|>`; Mistral's `[TOOL_CALLS]`), which the
gateway's parsers must see to read the calls and channels back (and which they strip).
"""

from __future__ import annotations

from typing import Any

_SPECIAL_IDS: dict[int, tuple[Any, frozenset[int]]] = {}  # id(tokenizer) -> (tokenizer, its special ids)


def special_ids(tokenizer: Any) -> frozenset[int]:
    """The ids `decode(..., skip_special_tokens=True)` leaves out: added tokens marked special, and
    the tokenizer's named special tokens (memoised per tokenizer object)."""
    found = _SPECIAL_IDS.get(id(tokenizer))
    if found is not None and found[0] is tokenizer:
        return found[1]
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    ids = {int(i) for i, tok in added.items() if getattr(tok, "special", False)}
    ids.update(int(i) for i in (getattr(tokenizer, "all_special_ids", None) or []))
    _SPECIAL_IDS[id(tokenizer)] = (tokenizer, frozenset(ids))
    return frozenset(ids)


class IncrementalDetokenizer:
    """Emits new text as tokens arrive. Text that could still become a stop string is held back,
    and the stop string itself is never emitted. `keep`: special token ids whose text stays in."""

    def __init__(self, tokenizer, stop: list[str] | None = None, keep: frozenset[int] = frozenset()):
        self.tok = tokenizer
        self.ids: list[int] = []
        self.prefix_offset = 0  # decoding restarts here so merges at the boundary come out right
        self.read_offset = 0
        self.text = ""  # all text decoded so far (stop string included if hit)
        self.emitted = 0  # characters of `text` already returned
        self.stop = [s for s in (stop or []) if s]
        self.stopped = False
        self.keep = frozenset(keep)
        # with markers kept, the other special tokens are left out by id and the rest decoded as is
        self.drop = special_ids(tokenizer) - self.keep if self.keep else frozenset()

    def decode(self, ids: list[int]) -> str:
        if not self.keep:
            return self.tok.decode(ids, skip_special_tokens=True)
        return self.tok.decode([i for i in ids if i not in self.drop], skip_special_tokens=False)

    def add(self, token_ids: list[int]) -> str:
        """Feed tokens; return the new text that is safe to emit."""
        self.ids.extend(token_ids)
        prefix = self.decode(self.ids[self.prefix_offset : self.read_offset])
        full = self.decode(self.ids[self.prefix_offset :])
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            self.text += full[len(prefix) :]
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)
        return self._emit()

    def restarted(self) -> IncrementalDetokenizer:
        """A new detokenizer with the same tokenizer, stop strings and kept markers."""
        return IncrementalDetokenizer(self.tok, self.stop, self.keep)

    def _emit(self) -> str:
        if self.stopped:
            return ""
        limit = len(self.text)
        for s in self.stop:
            at = self.text.find(s, max(0, self.emitted - len(s) + 1))
            if at != -1 and at < limit:
                limit = at
                self.stopped = True
        if not self.stopped:
            # Hold back a tail that is a prefix of some stop string.
            for s in self.stop:
                for k in range(min(len(s) - 1, len(self.text)), 0, -1):
                    if s.startswith(self.text[-k:]):
                        limit = min(limit, len(self.text) - k)
                        break
        out = self.text[self.emitted : limit] if limit > self.emitted else ""
        self.emitted = max(self.emitted, limit)
        return out

    def flush(self) -> str:
        """At the end: release held-back text (no stop string was completed)."""
        if self.stopped:
            return ""
        out = self.text[self.emitted :]
        self.emitted = len(self.text)
        return out

    @property
    def output_text(self) -> str:
        return self.text[: self.emitted]
