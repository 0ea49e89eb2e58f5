"""The incremental detokenizer: text streamed token by token equals the whole decoding, never half a
UTF-8 character, stop strings held back and cut; special tokens left out unless the request keeps
them (`GenerateRequest.keep_special_ids`: a format's markers, for the gateway's parsers), and then
only those. SmolLM2's tokenizer (byte-level BPE): `<|im_start|>` plays the kept marker,
`<|im_end|>` and `<|endoftext|>` the special tokens that stay out."""

from __future__ import annotations

import pytest

from runtime.api import EngineError, GenerateRequest
from runtime.decode.detokenizer import IncrementalDetokenizer, special_ids
from runtime.decode.sampling import SamplingParams
from runtime.engine.intake import Limits, validate

TEXT = 'Grüße, 東京 🌧️ -> {"city": "Oslo"}'


@pytest.fixture(scope="module")
def ids(tokenizer):
    def of(token: str) -> int:
        return tokenizer.convert_tokens_to_ids(token)

    return {"start": of("<|im_start|>"), "end": of("<|im_end|>"), "eot": of("<|endoftext|>")}


def streamed(detok: IncrementalDetokenizer, token_ids: list[int]) -> tuple[str, list[str]]:
    pieces = [detok.add([t]) for t in token_ids]
    pieces.append(detok.flush())
    return "".join(pieces), pieces


def sample(tokenizer, ids) -> list[int]:
    """Text with multi-byte characters on both sides of special tokens, kept and dropped ones (a
    marker never falls inside a character: the grammar writes it between texts)."""
    cut = TEXT.index("東")
    first, second = (tokenizer.encode(t, add_special_tokens=False) for t in (TEXT[:cut], TEXT[cut:]))
    return [ids["start"], *first, ids["end"], ids["start"], *second, ids["eot"], ids["start"]]


def test_without_kept_tokens_the_text_is_skip_special_tokens_decoding(tokenizer, ids):
    token_ids = sample(tokenizer, ids)
    text, pieces = streamed(IncrementalDetokenizer(tokenizer), token_ids)
    assert text == tokenizer.decode(token_ids, skip_special_tokens=True) == TEXT
    assert not any("\ufffd" in p for p in pieces)  # never half a character


def test_kept_markers_stay_in_the_text_whole_and_streamed_and_the_rest_stays_out(tokenizer, ids):
    token_ids = sample(tokenizer, ids)
    keep = frozenset({ids["start"]})
    text, pieces = streamed(IncrementalDetokenizer(tokenizer, keep=keep), token_ids)
    whole = IncrementalDetokenizer(tokenizer, keep=keep)
    assert whole.add(token_ids) + whole.flush() == text
    assert text.count("<|im_start|>") == 3
    assert "<|im_end|>" not in text and "<|endoftext|>" not in text
    assert text.replace("<|im_start|>", "") == TEXT
    kept = [ids["start"] if t == ids["start"] else t for t in token_ids if t not in (ids["end"], ids["eot"])]
    assert text == tokenizer.decode(kept, skip_special_tokens=False)
    assert not any("\ufffd" in p for p in pieces)
    assert "<|im_start|>" in pieces  # the marker comes out in one piece, as its token arrives


def test_a_stop_string_is_cut_with_markers_kept(tokenizer, ids):
    enc = tokenizer.encode("Oslo then Lima", add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, stop=["then"], keep=frozenset({ids["start"]}))
    text, _ = streamed(detok, [ids["start"], *enc])
    assert detok.stopped and text == "<|im_start|>Oslo "


def test_a_restarted_detokenizer_keeps_the_same_markers(tokenizer, ids):
    detok = IncrementalDetokenizer(tokenizer, stop=["x"], keep=frozenset({ids["start"]}))
    again = detok.restarted()
    assert (again.keep, again.stop, again.tok) == (detok.keep, detok.stop, detok.tok)
    assert again.add([ids["start"], ids["end"]]) == "<|im_start|>"


def test_special_ids_are_the_tokens_skip_special_tokens_drops(tokenizer, ids):
    found = special_ids(tokenizer)
    assert {ids["start"], ids["end"], ids["eot"]} <= found
    assert special_ids(tokenizer) is found  # memoised per tokenizer
    plain = tokenizer.encode("hello", add_special_tokens=False)
    assert not found & set(plain)


def test_kept_ids_outside_the_vocabulary_are_refused():
    limits = Limits(max_context=64, kv_pool_tokens=64, vocab_size=100)
    spec = GenerateRequest([1, 2], SamplingParams(max_new_tokens=4), keep_special_ids=frozenset({7, 100}))
    with pytest.raises(EngineError) as err:
        validate(spec, limits)
    assert err.value.param == "keep_special_ids" and "100" in err.value.message
