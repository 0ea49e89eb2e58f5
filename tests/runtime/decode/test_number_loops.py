"""Loops inside numbers (issue #42, item 4): a strict number's digit runs are bounded.

The bound (runtime/decode/completeness.py, `--max-number-digits`, 16 by default) counts a run of digits:
a number's integer part, fraction or exponent. A full run ends at the next token the grammar allows: a closer, or the stop token where the number is the whole output (a top-level
number had no closer, so it ran to the budget); where nothing can end it yet, the shortest
completion plan leads it to an end. Unit tests on a fake matcher, the real grammar with a
scripted model that writes `1` forever, then the real SmolLM2 primed to write 1.1111....
"""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
import torch
import xgrammar as xgr

from grammar import GrammarSpec
from grammar.checks.closing import allowed_subset
from runtime.api import GenerateRequest
from runtime.decode.completeness import MAX_DIGITS, CompletionGuard, runaway_number, trailing_digits
from runtime.decode.sampling import SamplingParams
from tests.conftest import chat_ids
from tests.runtime.decode.completeness_helpers import FakeMatcher

DIGIT_RUN = re.compile(r"[0-9]+")


def longest_digit_run(text: str) -> int:
    return max((len(m) for m in DIGIT_RUN.findall(text)), default=0)


# ==== the bounding rule ===========================================================================


def test_digit_runs_are_counted_per_part_of_the_number():
    assert trailing_digits("12.345") == 3 and trailing_digits("1e-12") == 2 and trailing_digits("1.") == 0
    assert not runaway_number("1" * 8 + "." + "1" * 8)  # 16 digits, but two runs of 8
    assert runaway_number("0." + "1" * MAX_DIGITS)  # a full run: the number ends at the next token
    assert runaway_number("1234", max_digits=4) and not runaway_number("123", max_digits=4)
    assert not runaway_number("\u0661" * 40)  # only ASCII digits make a JSON number


def test_the_bound_is_the_guards_setting():
    g = CompletionGuard(max_number_digits=4)
    g.after_token([1, 2, 3], '{"n":1.2345', closed_value=False)  # no repetition: only the bound fires
    assert g.close_value and g.in_digits
    g = CompletionGuard(max_number_digits=5)
    g.after_token([1, 2, 3], '{"n":1.2345', closed_value=False)
    assert not g.close_value


def test_the_engine_hands_its_bound_to_each_strict_guard(tiny_model_dir, service):
    from runtime.engine.engine import Engine

    engine = Engine(model=str(tiny_model_dir), kv_pool_tokens=2048, max_number_digits=5)
    handle = service.compile(GrammarSpec("json_schema", {"type": "number"}, True))
    req = engine.new_request(engine.validate(GenerateRequest([1, 2, 3], constraint=handle, strict=True)), print)
    assert req.guard.max_number_digits == 5


class NoCloserYet(FakeMatcher):
    """No token ends the current value now (a number below its `minimum`, say)."""

    def fill_value_closing_bitmask(self, mask, row):
        self.fills.append(("value",))
        return False


def test_a_runaway_number_that_cannot_end_yet_follows_the_shortest_completion():
    g, m = CompletionGuard(), NoCloserYet([5, 6])
    g.after_token([1, 2, 3], "0." + "0" * MAX_DIGITS, closed_value=False)
    g.before_choice(m, 3, 500)
    g.fill_mask(m, torch.full((1, 4), -1, dtype=torch.int32), 0)
    assert m.fills[-2:] == [("value",), ("closing", False, None)]  # not the plain mask: more digits


def test_a_repeating_string_that_cannot_end_yet_keeps_the_plain_mask():
    g, m, out = CompletionGuard(), NoCloserYet([5, 6]), []
    for _ in range(4):
        out += [41, 42, 43]
        g.after_token(out, '{"a":"abcabc', closed_value=False)
    assert g.close_value and not g.in_digits
    g.before_choice(m, len(out), 500)
    g.fill_mask(m, torch.full((1, 4), -1, dtype=torch.int32), 0)
    assert m.fills[-2:] == [("value",), ("plain",)]


# ==== the real grammar, a scripted model that writes `1` forever ==================================


def scripted_run(handle, tokenizer, text: str, guard: CompletionGuard, max_new: int = 200) -> str:
    """Decode as runtime/decode/decoding.py does for a strict greedy request whose model writes `text` and
    then `1` forever: the guard's mask; a choice it does not allow falls back to its plan's token."""
    one = tokenizer.encode("1", add_special_tokens=False)
    script = tokenizer.encode(text, add_special_tokens=False)
    matcher, out = handle.new_matcher(), []
    mask = xgr.allocate_token_bitmask(1, len(tokenizer))
    every = torch.arange(len(tokenizer))
    while len(out) < max_new and not matcher.is_terminated():
        guard.before_choice(matcher, len(out), max_new)
        mask.fill_(0)
        guard.fill_mask(matcher, mask, 0)
        allowed = set(allowed_subset(mask[0], every).tolist())
        want = script[len(out)] if len(out) < len(script) else one[0]
        tok = want if want in allowed and guard.allows(matcher, want, max_new - len(out)) else None
        if tok is None:
            tok = guard.fallback_token(matcher)
        if tok not in allowed:
            tok = min(allowed)
        assert matcher.accept(tok), (tokenizer.decode(out), tok)
        out.append(tok)
        text_so_far = tokenizer.decode(out, skip_special_tokens=True)
        guard.after_token(out, text_so_far[-256:], matcher.closes_value(tok))
    assert matcher.is_terminated(), tokenizer.decode(out)
    return tokenizer.decode(out, skip_special_tokens=True)


NUMBERS = {
    "top_level_number": ({"type": "number"}, "1."),
    "top_level_integer": ({"type": "integer"}, ""),
    "top_level_multiple_of": ({"type": "number", "multipleOf": 0.5}, ""),  # llguidance's exact mask
    "in_object": (
        {"type": "object", "properties": {"v": {"type": "number"}}, "required": ["v"], "additionalProperties": False},
        '{"v":1.',
    ),
    "in_array": ({"type": "array", "items": {"type": "number", "minimum": 1}}, "[1."),
    "exponent": ({"type": "number"}, "1e"),
}


@pytest.mark.parametrize("name", list(NUMBERS))
def test_a_number_that_would_run_on_ends_at_the_bound_and_is_valid(service, tokenizer, name):
    schema, start = NUMBERS[name]
    handle = service.compile(GrammarSpec("json_schema", schema, True))
    text = scripted_run(handle, tokenizer, start, CompletionGuard())
    assert longest_digit_run(text) <= MAX_DIGITS, text  # before: a run of ~200 digits at top level
    jsonschema.validate(json.loads(text), schema)


def test_a_lower_bound_ends_numbers_sooner(service, tokenizer):
    handle = service.compile(GrammarSpec("json_schema", {"type": "number"}, True))
    text = scripted_run(handle, tokenizer, "2.", CompletionGuard(max_number_digits=4))
    assert longest_digit_run(text) <= 4 and json.loads(text) == pytest.approx(2.1111, abs=1e-3), text


# ==== the real model through the real engine ======================================================

PRIMED = (
    "Write this number exactly, with every one of its digits: "
    "1.1111111111111111111111111111111111111111111111111111111111111111111111111111111111111111"
)


@pytest.mark.e2e
def test_the_real_model_primed_to_write_1_1111_gets_a_bounded_valid_number(real_engine, service, tokenizer):
    schema = {"type": "number"}
    handle = service.compile(GrammarSpec("json_schema", schema, True))
    ids = chat_ids(tokenizer, PRIMED, "You are a JSON API. Reply with one JSON value only.")
    budget = 64
    strict, loose = real_engine.generate_many(
        [
            GenerateRequest(ids, SamplingParams(max_new_tokens=budget, temperature=0.0), constraint=handle, strict=s)
            for s in (True, False)
        ],
        timeout=600,
    )
    # without strict mode the model writes digits until the budget: the loop is real
    assert loose.finish_reason == "length" and longest_digit_run(loose.text) > 2 * MAX_DIGITS, loose.text
    assert strict.finish_reason == "stop" and not strict.closed_at_budget, strict
    assert longest_digit_run(strict.text) <= MAX_DIGITS, strict.text
    assert strict.completion_tokens <= MAX_DIGITS + 4
    jsonschema.validate(json.loads(strict.text), schema)
