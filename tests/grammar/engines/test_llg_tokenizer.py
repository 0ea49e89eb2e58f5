"""grammar/engines/llguidance/tokenizer.py: llguidance encoding forced text through a memo of the Hugging Face
tokenizer's encodings gives the masks llguidance's own tokenizer gives, and falls back to that one
where the two views would differ."""

from __future__ import annotations

import json

import pytest
import torch

from bench.harness.workloads import corpus_examples
from grammar.engines.llguidance.matcher import LLGuidanceMatcher, compile_llguidance
from grammar.engines.llguidance.schema import llguidance_grammar, llguidance_refusal
from grammar.engines.llguidance.tokenizer import LLGuidanceTokenizer, MemoEncoder, build_llguidance_tokenizer, same_view
from runtime.model.loader import read_config


@pytest.fixture(scope="module")
def views(tokenizer, smollm_dir):
    """(memoized LLGuidanceTokenizer, llguidance's own tokenizer) for SmolLM2."""
    vocab = read_config(smollm_dir).vocab_size
    memo = LLGuidanceTokenizer(tokenizer, vocab, [tokenizer.eos_token_id])
    memo.get()
    own = LLGuidanceTokenizer(tokenizer, vocab, [tokenizer.eos_token_id], entries=0)
    return memo, own.get()


def test_the_memoized_view_is_taken_and_equals_llguidances_own(views):
    memo, own = views
    assert isinstance(memo.encoder, MemoEncoder)
    assert same_view(own, memo.get()) is None
    for text in ('{"name":"', "naïve café 🙂 end", "<|im_end|>tail", '"}]},{"', ""):
        assert memo.get().tokenize_str(text) == own.tokenize_str(text)


def test_masks_equal_llguidances_own_along_corpus_answers(views, tokenizer):
    """Every mask along the example answers of 24 corpus schemas, on a fresh matcher and again on
    a second one (whose forced texts the memo then answers), equals llguidance's own view's."""
    memo, own = views
    eos = tokenizer.eos_token_id
    words = (own.vocab_size + 31) // 32
    cases = [(n, s, v) for n, s, v in corpus_examples() if llguidance_refusal(s, strict=True) is None][:24]
    assert len(cases) == 24
    positions = 0
    hits_before = memo.encoder.cache_info().hits
    for name, schema, value in cases:
        grammar = llguidance_grammar(schema, strict=True)
        starts = [compile_llguidance(view, grammar, name, None) for view in (memo.get(), own)]
        tokens = tokenizer.encode(
            json.dumps(value, separators=(",", ":"), ensure_ascii=False), add_special_tokens=False
        ) + [eos]
        for _ in range(2):
            matchers = [LLGuidanceMatcher(start, frozenset({eos})) for start in starts]
            masks = [torch.zeros((1, words), dtype=torch.int32) for _ in matchers]
            for token in tokens:
                for matcher, mask in zip(matchers, masks):
                    matcher.fill_bitmask(mask, 0)
                assert torch.equal(masks[0], masks[1]), (name, tokenizer.decode([token]))
                assert all(matcher.accept(token) for matcher in matchers), name
                positions += 1
            assert all(matcher.is_terminated() for matcher in matchers)
    assert positions > 600
    assert memo.encoder.cache_info().hits > hits_before  # the second walks were answered from it


def test_no_memo_when_entries_is_zero(tokenizer, smollm_dir):
    built, encoder = build_llguidance_tokenizer(
        tokenizer, read_config(smollm_dir).vocab_size, [tokenizer.eos_token_id], entries=0
    )
    assert encoder is None and built.vocab_size == read_config(smollm_dir).vocab_size


def test_the_memo_is_bounded(views, tokenizer):
    memo, own = views
    encoder = MemoEncoder(own, tokenizer, [tokenizer.eos_token_id], entries=2)
    for text in ("a", "b", "c", "a"):
        assert encoder(text) == tokenizer.encode(text, add_special_tokens=False)
    assert encoder.cache_info().currsize == 2 and encoder.cache_info().maxsize == 2


class _ShiftedTokenizer:
    """A Hugging Face tokenizer whose backend encodes every id one higher (a view that differs)."""

    def __init__(self, real):
        self._real = real
        self.backend_tokenizer = self

    def __copy__(self):
        return self

    def no_padding(self):
        pass

    def no_truncation(self):
        pass

    def encode(self, text, add_special_tokens=False):
        ids = self._real.backend_tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

        class Encoding:
            pass

        out = Encoding()
        out.ids = [i + 1 for i in ids]
        return out


def test_a_view_that_encodes_differently_falls_back_to_llguidances_own(
    views, tokenizer, smollm_dir, caplog, monkeypatch
):
    memo, own = views
    import grammar.engines.llguidance.tokenizer as module

    # llguidance.hf builds its own view from the real tokenizer; the memo encodes through the shifted one
    monkeypatch.setattr(module.llguidance.hf, "from_tokenizer", lambda *a, **k: own)
    with caplog.at_level("INFO", logger="jumpgate.grammar"):
        built, encoder = build_llguidance_tokenizer(
            _ShiftedTokenizer(tokenizer), read_config(smollm_dir).vocab_size, [tokenizer.eos_token_id]
        )
    assert built is own and encoder is None
    assert "differs in the encoding of" in caplog.text
