"""LookupSettings (runtime/engine/intake.py): which engine steps feed the drafts' row cost."""

from __future__ import annotations

from types import SimpleNamespace

from runtime.decode.row_cost import PRIOR_SHARE
from runtime.engine.intake import LookupSettings


def req(rid: str, outputs: int) -> SimpleNamespace:
    return SimpleNamespace(rid=rid, output_ids=[7] * outputs)


def test_a_fixed_cost_is_kept_and_measures_nothing():
    settings = LookupSettings.build("ngram", 8, 0.3)
    assert settings.row_cost.share == 0.3 and not settings.row_cost.measured
    assert settings.made([req("a", 3)]) == {}
    assert settings.for_request(None).row_cost == 0.3


def test_by_default_the_cost_starts_at_the_prior_and_is_measured():
    settings = LookupSettings.build("ngram", 8, None)
    assert settings.row_cost.measured and settings.row_cost.share == PRIOR_SHARE
    assert settings.for_request("off") is None
    assert settings.for_request(None).cost is settings.row_cost  # one cost shared by every request


def test_only_decode_steps_are_observed_with_their_rows_and_yield():
    settings = LookupSettings.build("ngram", 8, None)
    a, b = req("a", 5), req("b", 2)
    made = settings.made([a, b])
    a.output_ids += [1, 2, 3]  # a draft of 2 kept, plus the pass's own token
    b.output_ids += [4]
    settings.observe([(a, 4), (b, 1)], made, 0.02)
    cost = settings.row_cost
    assert cost.steps == 1 and cost.sx == 5 and cost.sy == 0.02 and cost.per_token == 0.02 / 4
    fresh = req("c", 0)  # admitted this step: its prompt chunk makes this a prefill step
    made = settings.made([a])
    settings.observe([(a, 1), (fresh, 300)], made, 0.01)
    assert cost.steps == 1


def test_shared_answers_are_opt_in_and_grouped_by_prompt_start_and_namespace():
    prompt = list(range(100))
    alone = LookupSettings.build("ngram", 8, None)
    assert alone.for_request(None, prompt).shared is None  # the default: a request's own text only
    shared = LookupSettings.build("ngram", 8, None, shared=True)
    a, b = shared.for_request(None, prompt), shared.for_request(None, prompt + [1])
    assert a.shared is b.shared is not None and a.start == len(prompt)
    assert shared.for_request(None, prompt, namespace="tenant-b").shared is not a.shared
    assert shared.for_request("off", prompt) is None
