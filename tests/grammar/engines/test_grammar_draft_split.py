"""DraftSplitter: jump-forward drafts in the model's own split, learned from its choices."""

from __future__ import annotations

import pytest

from grammar import GrammarSpec
from grammar.engines.draft_split import DraftSplitter, ForcedSpanWatch

NAME_ONLY = {"type": "object", "properties": {"full_name": {"type": "string"}}, "required": ["full_name"]}
TAGS = {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"}}}, "required": ["tags"]}


def ids(tokenizer, text):
    return tokenizer.encode(text, add_special_tokens=False)


def one(tokenizer, piece):
    (token,) = ids(tokenizer, piece)
    return token


@pytest.fixture
def splitter(service, tokenizer):
    return DraftSplitter(lambda t: ids(tokenizer, t), service.tokenizer_info.decoded_vocab)


def test_unknown_text_is_split_canonically(splitter, tokenizer):
    assert splitter.split('","job_title":"') == ids(tokenizer, '","job_title":"')
    assert splitter.split("") == []


def test_a_learned_choice_is_used_and_the_rest_is_split_canonically(splitter, tokenizer):
    text = '"full_name":"'
    splitter.learn(b'full_name":"', one(tokenizer, "f"))
    draft = splitter.split(text)
    assert tokenizer.decode(draft) == text
    assert draft[:2] == [one(tokenizer, '"'), one(tokenizer, "f")]
    assert draft[2:] == ids(tokenizer, 'ull_name":"')  # canonical after the learned token


def test_the_latest_choice_wins(splitter, tokenizer):
    rest = b'":"'
    colon_quote, colon = one(tokenizer, '":"'), one(tokenizer, '":')
    splitter.learn(rest, colon)
    assert splitter.split('":"')[0] == colon
    splitter.learn(rest, colon_quote)
    assert splitter.split('":"') == [colon_quote]


def test_memory_is_bounded(service, tokenizer):
    small = DraftSplitter(lambda t: ids(tokenizer, t), service.tokenizer_info.decoded_vocab, max_entries=3)
    for key in (b"a1", b"b2", b"c3", b"d4"):
        small.learn(key, one(tokenizer, "a"))
    assert len(small) == 3


def test_keys_are_the_next_bytes_of_forced_text_only(splitter, tokenizer):
    """A long const (kilobytes of forced text) costs at most KEY_BYTES per learned choice."""
    from grammar.engines.draft_split import KEY_BYTES

    long_text = '"' + "x" * (4 * KEY_BYTES) + '"'
    quote = one(tokenizer, '"')
    splitter.learn(long_text.encode(), quote)
    assert splitter.split(long_text)[0] == quote  # found by its first KEY_BYTES bytes
    assert all(len(k) <= KEY_BYTES for k in splitter.learned_keys())


def test_watch_teaches_each_choice_until_the_span_is_written(splitter, tokenizer):
    watch = ForcedSpanWatch(splitter, '":"')
    assert watch.accepted(one(tokenizer, '":'))  # more of the span to come
    assert not watch.accepted(one(tokenizer, '"'))  # written
    assert splitter.split('":"') == [one(tokenizer, '":'), one(tokenizer, '"')]


def test_watch_stops_on_a_token_off_the_span(splitter, tokenizer):
    watch = ForcedSpanWatch(splitter, '":"')
    assert not watch.accepted(one(tokenizer, "x"))
    assert len(splitter) == 0


def test_matcher_learns_the_models_split_and_drafts_it_next_time(service, tokenizer):
    handle = service.compile(GrammarSpec.json_schema(NAME_ONLY))
    first = handle.new_matcher()
    canonical = first.jump_forward_tokens()
    assert tokenizer.decode(canonical) == '{"full_name":"'
    # the "model" writes the span its own way: `{"` `f` `ull` `_name` `":` `"`
    model_split = (
        ids(tokenizer, '{"')
        + [one(tokenizer, "f")]
        + ids(tokenizer, "ull_name")
        + [one(tokenizer, '":'), one(tokenizer, '"')]
    )
    assert tokenizer.decode(model_split) == '{"full_name":"' and model_split != canonical
    for token in model_split:
        assert first.accept(token)
    # a new request with the same grammar drafts the learned split (and it is grammar-valid)
    assert handle.new_matcher().jump_forward_tokens() == model_split


def test_a_choice_straddling_the_end_of_the_span_is_drafted_only_where_valid(service, tokenizer):
    handle = service.compile(GrammarSpec.json_schema(TAGS))
    m = handle.new_matcher()
    assert m.jump_forward_string() == '{"tags":['
    span = m.jump_forward_tokens()
    for token in span[:-1]:
        assert m.accept(token)
    open_quote = one(tokenizer, '["')  # `[` is forced, its string's quote is the model's choice
    assert m.accept(open_quote)
    draft = handle.new_matcher().jump_forward_tokens()
    assert draft[-1] == open_quote and tokenizer.decode(draft) == '{"tags":["'


def test_direct_insertion_teaches_nothing(service, tokenizer):
    handle = service.compile(
        GrammarSpec.json_schema(
            {"type": "object", "properties": {"zeta_value": {"type": "integer"}}, "required": ["zeta_value"]}
        )
    )
    before = len(service.draft_splitter)
    m = handle.new_matcher()
    for token in m.jump_forward_tokens(learn=False):
        assert m.accept(token)
    assert len(service.draft_splitter) == before
