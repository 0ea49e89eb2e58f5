"""Incremental detokenization that never emits half a UTF-8 character, with stop-string handling."""

from __future__ import annotations


class IncrementalDetokenizer:
    """Emits new text as tokens arrive. Text that could still become a stop string is held back,
    and the stop string itself is never emitted."""

    def __init__(self, tokenizer, stop: list[str] | None = None):
        self.tok = tokenizer
        self.ids: list[int] = []
        self.prefix_offset = 0  # decoding restarts here so merges at the boundary come out right
        self.read_offset = 0
        self.text = ""  # all text decoded so far (stop string included if hit)
        self.emitted = 0  # characters of `text` already returned
        self.stop = [s for s in (stop or []) if s]
        self.stopped = False

    def add(self, token_ids: list[int]) -> str:
        """Feed tokens; return the new text that is safe to emit."""
        self.ids.extend(token_ids)
        prefix = self.tok.decode(self.ids[self.prefix_offset : self.read_offset], skip_special_tokens=True)
        full = self.tok.decode(self.ids[self.prefix_offset :], skip_special_tokens=True)
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            self.text += full[len(prefix) :]
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)
        return self._emit()

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
