"""The value check's view of text: each token's bytes and the token sets it looks names and items
up in (`ValueCheckVocab`, once per vocabulary), and how a JSON string spells a value.
"""

from __future__ import annotations

import functools
import json

import numpy as np

SCALAR_BYTES = frozenset(b"0123456789+-.eEtrufalsn")  # what numbers, true, false and null are made of
FILLERS = ("x", "q", "z", "k", "1", "2", "3", "5", "7", "9")  # grow a repeated name or item in a plan


class ValueCheckVocab:
    """Token texts and the tokens that can complete a name or an item, computed once per vocabulary."""

    def __init__(self, decoded_vocab: list[bytes], special_ids: frozenset[int]) -> None:
        self.texts = [b"" if i in special_ids else bytes(t) for i, t in enumerate(decoded_vocab)]
        self.vocab_size = len(self.texts)
        self.quote_ids = np.array([i for i, t in enumerate(self.texts) if b'"' in t], dtype=np.int64)
        self.struct_ids = np.array(
            [i for i, t in enumerate(self.texts) if any(c in t for c in b'",]}')], dtype=np.int64
        )
        # only a token with two quotes can both open and close a name
        self.two_quote_ids = np.array([i for i, t in enumerate(self.texts) if t.count(b'"') >= 2], dtype=np.int64)
        # Inside a name or a unique item: a token with one quote, no backslash and no bracket after the
        # quote completes exactly the text before its quote, so the tokens to ban are looked up by that
        # text; the others (`":"`, `\"`, `"]`) are simulated.
        self.closing_by_text: dict[bytes, list[int]] = {}
        # between a unique array's items: what can complete one (a whole string, a delimiter) or
        # write a second integer 0
        delimiting = [i for i, t in enumerate(self.texts) if any(c in t for c in b",]}")]
        zero = [i for i, t in enumerate(self.texts) if t.startswith((b"0", b"-0"))]
        self.item_start_ids = np.unique(np.array(self.two_quote_ids.tolist() + delimiting + zero, dtype=np.int64))
        # inside a number or literal only a token with another character can end it
        self.scalar_only = np.array([bool(t) and all(c in SCALAR_BYTES for c in t) for t in self.texts], dtype=bool)
        complex_ids = []
        for i in self.quote_ids.tolist():
            before, _, after = self.texts[i].partition(b'"')
            if b'"' in after or b"\\" in before or any(c in after for c in b"]}"):
                complex_ids.append(i)
            else:
                self.closing_by_text.setdefault(before, []).append(i)
        self.complex_quote_ids = np.array(complex_ids, dtype=np.int64)
        by_text = {t: i for i, t in enumerate(self.texts) if t}
        self.filler_ids = [by_text[f.encode()] for f in FILLERS if f.encode() in by_text]


@functools.lru_cache(maxsize=8192)
def plain_spelling(text: str) -> bytes | None:
    """How a JSON string spells `text` without escapes (None: it needs one)."""
    raw = text.encode()
    return None if any(c in raw for c in b'"\\') or any(c < 0x20 for c in raw) else raw


@functools.lru_cache(maxsize=8192)
def plain_item(canon: str) -> bytes | None:
    return plain_spelling(json.loads(canon))


def decode_json_string(raw: bytes) -> str:
    """A JSON string's value from the bytes between its quotes (its raw text if malformed)."""
    try:
        return json.loads(b'"' + raw + b'"')
    except ValueError:
        return raw.decode("utf-8", "replace")
