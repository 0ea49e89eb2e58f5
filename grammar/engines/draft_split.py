"""Jump-forward drafts tokenized the way the model writes, learned from what it wrote.

A forced span has many tokenizations, and the tokenizer's own (canonical) one is often not the
model's: SmolLM2 writes `":` + `"` where the tokenizer has one `":"` token, and spells keys as
`f` + `ul` + `l` + `_` + `name`. Under `verify` every draft token after the first disagreement is
wasted work, so a canonical draft loses about half its tokens on such a model.

`DraftSplitter` remembers, for each remaining forced text (the part of a forced span not yet
written), the token the model chose there last, and drafts with it the next time the same text
is forced. The choice depends a little on context (SmolLM2 writes `h` + `ead...` after some values
and `head` after others); on the extraction bench the latest choice did better than a majority
vote (101 against 111 forward passes for the same 8-request batch once learned). Where it knows
nothing it falls back to the canonical encoding. A choice may straddle the end of the span (`["`
where only `[` is forced); the matcher cuts every draft to what the grammar accepts, so such a
token is drafted only where it is valid. What the splitter learns never changes outputs
(verification is exact); it only changes how many draft tokens survive.

One splitter serves every grammar of one tokenizer (the preference is the model's, not the
schema's, so `":` learned on one schema helps all). Bounded LRU; touched only from the engine
thread (matchers live there).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence

Encode = Callable[[str], list[int]]

# A choice is keyed by the next this-many bytes of forced text, not all of it: memory stays bounded
# (a forced span can be kilobytes of const text) and the choice depends on what comes next.
KEY_BYTES = 64


class DraftSplitter:
    def __init__(self, encode: Encode, token_bytes: Sequence[bytes], max_entries: int = 16384) -> None:
        self._encode = encode
        self._token_bytes = token_bytes
        self._max_entries = max_entries
        self._learned: OrderedDict[bytes, int] = OrderedDict()  # remaining forced text -> model's token

    def __len__(self) -> int:
        return len(self._learned)

    def learned_keys(self) -> list[bytes]:
        """The remaining-forced-text keys it holds, least recently used first (tests check their bound)."""
        return list(self._learned)

    def token_bytes(self, token_id: int) -> bytes:
        return self._token_bytes[token_id] if 0 <= token_id < len(self._token_bytes) else b""

    def split(self, text: str) -> list[int]:
        """Draft tokens for forced `text`: learned choices where known, canonical elsewhere."""
        data = text.encode()
        out: list[int] = []
        pos = 0
        canonical: list[int] = []  # canonical encoding of data[pos:], consumed from the front
        while pos < len(data):
            key = data[pos : pos + KEY_BYTES]
            token = self._learned.get(key)
            if token is not None:
                self._learned.move_to_end(key)
                canonical = []  # the split moved off the canonical one: re-encode when needed
            else:
                if not canonical:
                    try:
                        canonical = self._encode(data[pos:].decode())
                    except UnicodeDecodeError:  # a learned token ended inside a character
                        break
                    if not canonical:
                        break
                    canonical.reverse()
                token = canonical.pop()
            step = len(self.token_bytes(token))
            if step == 0:  # special or unknown token: nothing to draft past it
                break
            out.append(token)
            pos += step
        return out

    def learn(self, remaining: bytes, token_id: int) -> None:
        """The model wrote `token_id` where `remaining` was the forced text still to write."""
        if not remaining:
            return
        key = remaining[:KEY_BYTES]
        self._learned[key] = token_id
        self._learned.move_to_end(key)
        while len(self._learned) > self._max_entries:
            self._learned.popitem(last=False)


class ForcedSpanWatch:
    """Follows one forced span while its tokens are accepted, teaching the splitter each choice."""

    __slots__ = ("_splitter", "_text", "_pos")

    def __init__(self, splitter: DraftSplitter, text: str) -> None:
        self._splitter, self._text, self._pos = splitter, text.encode(), 0

    def accepted(self, token_id: int) -> bool:
        """Record the model's token; False once the span is written (or left), i.e. done."""
        remaining = self._text[self._pos :]
        piece = self._splitter.token_bytes(token_id)
        # inside the span, or straddling its end; anything else means the span was not followed
        if not piece or not (remaining.startswith(piece) or piece.startswith(remaining)):
            return False
        self._splitter.learn(remaining, token_id)
        self._pos += len(piece)
        return self._pos < len(self._text)
