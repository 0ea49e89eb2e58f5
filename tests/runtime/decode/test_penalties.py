"""Penalties, logit biases, min_tokens and stop_token_ids (issue #46 item 3).

runtime/decode/penalties.py on one row (the arithmetic, masked tokens staying masked), then the real
SmolLM2 through the real engine, greedy (each option changes the output the way it says, and a
grammar still holds), then the real server answering the official client.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from grammar import GrammarSpec
from runtime.api import EngineError, GenerateRequest
from runtime.decode.penalties import adjust_logits_, hold_stop_
from runtime.decode.sampling import SamplingParams
from tests.conftest import chat_ids, openai_client

# ==== runtime/decode/penalties.py ========================================================================


def test_presence_and_frequency_follow_openai():
    row = torch.zeros(6)
    adjust_logits_(row, SamplingParams(presence_penalty=0.5, frequency_penalty=0.25), [], [1, 1, 1, 4])
    # token 1 thrice: 0.5 + 3 * 0.25; token 4 once: 0.5 + 0.25; the rest untouched
    assert row.tolist() == [0.0, -1.25, 0.0, 0.0, -0.75, 0.0]


def test_repetition_penalty_shrinks_seen_logits_toward_less_likely():
    row = torch.tensor([2.0, -2.0, 2.0, -2.0])
    adjust_logits_(row, SamplingParams(repetition_penalty=2.0), [0], [1])
    assert row.tolist() == [1.0, -4.0, 2.0, -2.0]  # prompt and output tokens; unseen ones untouched


def test_a_bias_never_unmasks_a_token():
    row = torch.tensor([0.0, float("-inf"), 1.0])
    adjust_logits_(row, SamplingParams(logit_bias={1: 100.0, 0: -5.0}), [], [])
    assert row.tolist() == [-5.0, float("-inf"), 1.0]


def test_min_tokens_holds_the_stop_token_unless_nothing_else_is_left():
    p = SamplingParams(min_tokens=3, stop_token_ids=[2])
    row = torch.tensor([0.0, 1.0, 5.0, 9.0])
    hold_stop_(row, p, produced=1, stop_ids={3})
    assert row.tolist() == [0.0, 1.0, float("-inf"), float("-inf")]
    row = torch.tensor([float("-inf"), float("-inf"), float("-inf"), 9.0])  # a grammar that must end
    hold_stop_(row, p, produced=1, stop_ids={3})
    assert row.tolist()[3] == 9.0
    row = torch.tensor([0.0, 1.0, 5.0, 9.0])
    hold_stop_(row, p, produced=3, stop_ids={3})  # enough tokens out
    assert row.tolist() == [0.0, 1.0, 5.0, 9.0]


def test_bad_values_are_refused_by_name():
    for bad, name in (
        (dict(presence_penalty=2.5), "presence_penalty"),
        (dict(repetition_penalty=0.0), "repetition_penalty"),
        (dict(logit_bias={3: 200.0}), "logit_bias"),
        (dict(min_tokens=9, max_new_tokens=4), "min_tokens"),
    ):
        with pytest.raises(ValueError, match=name):
            SamplingParams(**bad).validate()


# ==== the real engine =============================================================================


def greedy(**fields) -> SamplingParams:
    return SamplingParams(temperature=0.0, **fields)


SHORT = "What is 2+2? Answer with one number."  # greedy SmolLM2: 'The answer is 4.' (7 tokens)


@pytest.fixture(scope="module")
def prompt(tokenizer):
    return chat_ids(tokenizer, "Write the word 'cat' ten times, separated by spaces.")


@pytest.mark.e2e
def test_each_option_changes_the_greedy_output_as_it_says(real_engine, tokenizer, prompt):
    (banana,) = tokenizer.encode(" banana", add_special_tokens=False)
    plain, biased, penalized, held = real_engine.generate_many(
        [
            GenerateRequest(prompt, greedy(max_new_tokens=24)),
            GenerateRequest(prompt, greedy(max_new_tokens=24, logit_bias={banana: 100.0})),
            GenerateRequest(prompt, greedy(max_new_tokens=24, frequency_penalty=2.0, presence_penalty=1.0)),
            GenerateRequest(chat_ids(tokenizer, SHORT), greedy(max_new_tokens=40, min_tokens=20)),
        ],
        timeout=600,
    )
    assert plain.token_ids[0] != banana and biased.token_ids[0] == banana
    most_plain = Counter(plain.token_ids).most_common(1)[0][1]
    most_penalized = Counter(penalized.token_ids).most_common(1)[0][1]
    assert most_plain >= 5 and most_penalized < most_plain, (plain.text, penalized.text)
    assert held.completion_tokens >= 20, held


@pytest.mark.e2e
def test_min_tokens_alone_lengthens_a_short_answer(real_engine, tokenizer):
    ids = chat_ids(tokenizer, SHORT)
    short, held = real_engine.generate_many(
        [
            GenerateRequest(ids, greedy(max_new_tokens=40)),
            GenerateRequest(ids, greedy(max_new_tokens=40, min_tokens=20)),
        ],
        timeout=600,
    )
    assert short.finish_reason == "stop" and short.completion_tokens < 20
    assert held.completion_tokens >= 20
    assert held.token_ids[:3] == short.token_ids[:3]  # the same answer until its end is held back


@pytest.mark.e2e
def test_stop_token_ids_end_the_output_at_that_token(real_engine, prompt):
    plain = real_engine.generate(prompt, greedy(max_new_tokens=16))
    stop_at = plain.token_ids[3]
    first = plain.token_ids.index(stop_at)
    stopped = real_engine.generate(prompt, greedy(max_new_tokens=16, stop_token_ids=[stop_at]))
    assert stopped.finish_reason == "stop"
    assert stopped.token_ids[:first] == plain.token_ids[:first] and len(stopped.token_ids) <= first + 1


@pytest.mark.e2e
def test_a_bias_cannot_leave_the_grammar(real_engine, tokenizer, service):
    handle = service.compile(GrammarSpec.regex(r"(yes|no)"))
    maybe = tokenizer.encode(" maybe", add_special_tokens=False)[0]
    ids = chat_ids(tokenizer, "Answer maybe.")
    out = real_engine.generate(
        ids, greedy(max_new_tokens=8, logit_bias={maybe: 100.0}, presence_penalty=2.0), constraint=handle
    )
    assert out.text in ("yes", "no"), out


def test_ids_outside_the_vocabulary_are_refused(real_engine, prompt):
    vocab = real_engine.model_config.vocab_size
    for fields, param in (
        (dict(logit_bias={vocab: 1.0}), "logit_bias"),
        (dict(stop_token_ids=[vocab + 5]), "stop_token_ids"),
    ):
        with pytest.raises(EngineError) as e:
            real_engine.validate(GenerateRequest(prompt, greedy(max_new_tokens=4, **fields)))
        assert e.value.param == param


# ==== the real server and the official client =====================================================


@pytest.mark.e2e
def test_the_official_client_sends_them(jumpgate_server, tokenizer):
    from bench.harness.server_process import MODEL

    client = openai_client(jumpgate_server)
    (banana,) = tokenizer.encode(" banana", add_special_tokens=False)
    messages = [{"role": "user", "content": "Write the word 'cat' ten times."}]
    r = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        temperature=0,
        max_tokens=8,
        logit_bias={str(banana): 100},
        presence_penalty=0.5,
        extra_body={"repetition_penalty": 1.1, "min_tokens": 8},
    )
    assert r.choices[0].message.content.startswith(" banana") or r.choices[0].message.content.startswith("banana")
    assert r.usage.completion_tokens == 8
    t = client.completions.create(
        model=MODEL,
        prompt="cat cat cat cat",
        temperature=0,
        max_tokens=6,
        frequency_penalty=2.0,
        logit_bias={str(banana): 100},
    )
    assert "banana" in t.choices[0].text
    resp = client.responses.create(
        model=MODEL,
        input="Write the word 'cat' ten times.",
        max_output_tokens=8,
        temperature=0,
        extra_body={"logit_bias": {str(banana): 100}, "min_tokens": 8},
    )
    assert "banana" in resp.output_text and resp.usage.output_tokens == 8
