"""Logprob records from the engine (runtime.api.TokenLogprob) -> OpenAI's logprob shapes.

What the values are is documented in runtime/decode/logprobs.py: the log-softmax of the grammar-masked
logits, before temperature / top-k / top-p (so a token the grammar forbids never appears in
`top_logprobs`). Direct-mode jump-forward tokens had no forward pass: they report 0.0 and carry the
Jumpgate extension `"forced": true` (chat / responses shape only; the legacy shape has no room).

Token strings are the tokenizer's decoding of the single token; `bytes` are the token's raw bytes
(byte-level BPE tokens that hold part of a UTF-8 character decode to U+FFFD, their bytes do not).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Iterable

from msgspec import UNSET

from gateway.protocol import ChatTokenLogprob, ChoiceLogprobs, CompletionLogprobs, TopLogprob
from runtime.api import TokenLogprob


@dataclass(frozen=True)
class TokenText:
    text: str
    raw: bytes


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, inverted: the character a byte is written as -> the byte."""
    printable = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars, extra = [], 0
    for b in range(256):
        if b in printable:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return {c: b for b, c in enumerate(chars)}


class TokenTexts:
    """Token id -> (text, bytes) for one tokenizer, memoised (ids repeat across requests)."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.cache: dict[int, TokenText] = {}

    def __call__(self, token_id: int) -> TokenText:
        found = self.cache.get(token_id)
        if found is None:
            text = self.tokenizer.decode([token_id])
            found = self.cache[token_id] = TokenText(text, self._raw_bytes(token_id, text))
        return found

    def _raw_bytes(self, token_id: int, text: str) -> bytes:
        if "\ufffd" in text:  # part of a UTF-8 character: read the byte-level token itself
            piece = self.tokenizer.convert_ids_to_tokens(token_id)
            table = _byte_decoder()
            if isinstance(piece, str) and piece and all(c in table for c in piece):
                return bytes(table[c] for c in piece)
        return text.encode("utf-8")


_texts_by_tokenizer: dict[int, TokenTexts] = {}


def token_texts(tokenizer: Any) -> TokenTexts:
    """The memo of `tokenizer` (one per tokenizer object for the life of the process)."""
    texts = _texts_by_tokenizer.get(id(tokenizer))
    if texts is None or texts.tokenizer is not tokenizer:
        texts = _texts_by_tokenizer[id(tokenizer)] = TokenTexts(tokenizer)
    return texts


def chat_token_logprobs(records: Iterable[TokenLogprob], texts: TokenTexts) -> list[ChatTokenLogprob]:
    """The chat shape (`choices[i].logprobs.content`), which is also the Responses API's
    `output_text.logprobs` (include: ["message.output_text.logprobs"])."""
    out = []
    for rec in records:
        tok = texts(rec.token_id)
        top = [TopLogprob(token=texts(t).text, logprob=v, bytes=list(texts(t).raw)) for t, v in rec.top]
        out.append(
            ChatTokenLogprob(
                token=tok.text,
                logprob=rec.logprob,
                bytes=list(tok.raw),
                top_logprobs=top,
                forced=True if rec.forced else UNSET,
            )
        )
    return out


def chat_logprobs(records: Iterable[TokenLogprob] | None, texts: TokenTexts) -> ChoiceLogprobs | None:
    return None if records is None else ChoiceLogprobs(content=chat_token_logprobs(records, texts))


def completion_logprobs(
    records: list[TokenLogprob] | None, texts: TokenTexts, offset: int = 0
) -> CompletionLogprobs | None:
    """The legacy text-completion shape; `offset` is where these tokens' text starts in the
    choice's text (streamed chunks continue where the previous one ended). `top_logprobs` is null
    when the request asked for no alternatives (`logprobs: 0`)."""
    if records is None:
        return None
    with_top = any(rec.top for rec in records)
    out = CompletionLogprobs(tokens=[], token_logprobs=[], top_logprobs=[] if with_top else None, text_offset=[])
    for rec in records:
        tok = texts(rec.token_id).text
        out.tokens.append(tok)
        out.token_logprobs.append(rec.logprob)
        out.text_offset.append(offset)
        offset += len(tok)
        if out.top_logprobs is not None:
            out.top_logprobs.append({texts(t).text: v for t, v in rec.top})
    return out


def text_length(records: Iterable[TokenLogprob], texts: TokenTexts) -> int:
    """Characters the tokens' texts span (the next chunk's `text_offset` start)."""
    return sum(len(texts(rec.token_id).text) for rec in records)
