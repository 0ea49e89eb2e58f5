"""llguidance's view of the model's tokenizer, with the encodings of forced text remembered.

At a position where the grammar forces text (`"error":{"code":` after `{"`), llguidance's mask is
the one token that begins the text's canonical encoding, so it encodes that text with the model's
tokenizer at every such position, through the Hugging Face tokenizer: a large part of llguidance's
mask time on JSON schemas (`python -m bench grammar_engines` reports it with and without this
memo, `llguidance_uncached_us`). The same forced texts come back at every request of a schema
(its property names and separators), so `MemoEncoder` answers llguidance's encode calls from an
LRU cache of the Hugging Face tokenizer's own encodings: the same ids, so the same masks
(tests/grammar/engines/test_llg_tokenizer.py compares them along the corpus walks), for a Python callback on a hit.

The vocabulary (token bytes, special tokens, stop tokens) is copied from the tokenizer that
`llguidance.hf` builds from the same Hugging Face tokenizer; `build_llguidance_tokenizer` checks
that the two agree on every id and on a probe encoding, and keeps llguidance's own when they do not.

Threads: llguidance calls the encoder with the GIL re-taken (`unsafe_compute_mask_ptr` releases it
around the mask); it never calls it while holding a parser's lock, so the callback cannot deadlock
against another thread's llguidance call. `functools.lru_cache` is safe under concurrent calls.
"""

from __future__ import annotations

import functools
import logging
import threading
from copy import copy
from typing import Any

import llguidance
import llguidance.hf

log = logging.getLogger("jumpgate.grammar")

# Distinct forced texts remembered per tokenizer. They are short (a property name and its
# separators), so 65,536 of them take a few MB.
ENCODINGS_KEPT = 1 << 16

# Texts whose encodings must agree with llguidance's own before the memoized view is used.
_PROBES = ('{"error":{"code":', '","message":"', "héllo wörld 🙂", " \n\t", "<|im_end|>", "a")


class MemoEncoder:
    """llguidance's `TokenizerWrapper` protocol over a Hugging Face fast tokenizer whose encodings
    are remembered (LRU)."""

    is_tokenizer_wrapper = True  # what llguidance checks before taking a Python tokenizer

    def __init__(
        self,
        reference: llguidance.LLTokenizer,
        hf_tokenizer: Any,
        stop_token_ids: list[int],
        entries: int = ENCODINGS_KEPT,
    ) -> None:
        ids = range(reference.vocab_size)
        self.tokens = [reference.decode_bytes([i]) for i in ids]
        self.special_token_ids = [i for i in ids if reference.is_special_token(i)]
        self.eos_token_id = stop_token_ids[0]
        self.bos_token_id = None
        # the tokenizer as llguidance.hf takes it: no padding, no truncation
        backend = copy(hf_tokenizer.backend_tokenizer)
        backend.no_padding()
        backend.no_truncation()
        self._encode = functools.lru_cache(maxsize=entries)(
            lambda text: backend.encode(text, add_special_tokens=False).ids
        )

    def __call__(self, text: str) -> list[int]:
        return self._encode(text)

    def cache_info(self):
        return self._encode.cache_info()


def same_view(reference: llguidance.LLTokenizer, other: llguidance.LLTokenizer) -> str | None:
    """None when `other` has `reference`'s vocabulary and encodes the probes alike; else what differs."""
    if other.vocab_size != reference.vocab_size or other.eos_tokens != reference.eos_tokens:
        return f"vocabulary {other.vocab_size}/{other.eos_tokens} vs {reference.vocab_size}/{reference.eos_tokens}"
    for i in range(reference.vocab_size):
        if other.decode_bytes([i]) != reference.decode_bytes([i]) or other.is_special_token(
            i
        ) != reference.is_special_token(i):
            return f"token {i}"
    for text in _PROBES:
        if other.tokenize_str(text) != reference.tokenize_str(text):
            return f"the encoding of {text!r}"
    return None


def build_llguidance_tokenizer(
    hf_tokenizer: Any, vocab_size: int, stop_token_ids: list[int], entries: int = ENCODINGS_KEPT
) -> tuple[llguidance.LLTokenizer, MemoEncoder | None]:
    """llguidance's tokenizer for the model and the `MemoEncoder` it encodes through; llguidance's
    own view (from `llguidance.hf`) and None where the two would differ or `entries` is 0."""
    reference = llguidance.hf.from_tokenizer(hf_tokenizer, n_vocab=vocab_size, eos_token=stop_token_ids)
    if entries <= 0:
        return reference, None
    try:
        encoder = MemoEncoder(reference, hf_tokenizer, stop_token_ids, entries)
        memo = llguidance.LLTokenizer(encoder, eos_token=stop_token_ids)
    except (ValueError, AttributeError, TypeError) as exc:  # not a fast tokenizer, or llguidance refuses it
        log.info("llguidance encodes forced text uncached: %s", exc)
        return reference, None
    differs = same_view(reference, memo)
    if differs is not None:
        log.info("llguidance encodes forced text uncached: the memoized view differs in %s", differs)
        return reference, None
    return memo, encoder


class LLGuidanceTokenizer:
    """The llguidance view of the model's tokenizer, built on first use (llguidance's own view, then
    the memoized one over it); `encoder` is its MemoEncoder once built (None: llguidance encodes
    uncached)."""

    def __init__(
        self, hf_tokenizer: Any, vocab_size: int, stop_token_ids: list[int], entries: int = ENCODINGS_KEPT
    ) -> None:
        self._args = (hf_tokenizer, vocab_size, list(stop_token_ids), entries)
        self._built: llguidance.LLTokenizer | None = None
        self.encoder: MemoEncoder | None = None
        self._lock = threading.Lock()

    def get(self) -> llguidance.LLTokenizer:
        with self._lock:
            if self._built is None:
                self._built, self.encoder = build_llguidance_tokenizer(*self._args)
            return self._built
