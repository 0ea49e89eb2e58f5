"""Strict responses always complete, on the real SmolLM2, greedy: loop-prone corpus schemas at tight
budgets give complete, valid JSON; a budget below the smallest instance is refused at once;
well-behaved output is identical with and without strict mode; non-strict output is never altered."""

from __future__ import annotations

import json

import pytest

from runtime.api import EngineError, GenerateRequest
from runtime.decode.sampling import SamplingParams
from tests.conftest import chat_ids
from tests.runtime.decode.completeness_helpers import SCHEMAS, compile_schema, errors_of

# ==== the real SmolLM2 ============================================================================

LOOP_PRONE = {
    "loop_prone_long_free_text": "Summarize this report as title, summary and details. Report: The harbour "
    "authority met on Monday to review the winter dredging plan. Silt levels rose 14 percent after the "
    "November storms, two berths are restricted to vessels under 9 metres draught, and the contractor asks "
    "for a six week extension. The board approved the extension and a night-time noise exemption.",
    "loop_prone_string_array": "List the keywords of this text: Solar panels, heat pumps and home batteries "
    "cut the household's energy bill by 40 percent; the installer also fitted smart thermostats.",
    "loop_prone_nested_arrays": "Write the temperature readings as a matrix, one row per day: Monday 3.5, "
    "7.25, 5; Tuesday 4, 8.5, 6.75; Wednesday 2.5, 6, 4.5.",
    "loop_prone_deep_string_arrays": "Group these words into groups of groups: apple, pear, plum; carrot, "
    "leek; oak, pine, birch, elm.",
    "loop_prone_array_of_notes": "Turn these minutes into notes with a title and a body: budget approved "
    "for Q3; hiring freeze lifted in the support team; office move postponed to October.",
    "loop_prone_free_object_map": "Label each item with its category: hammer, tulip, violin, salmon, granite.",
    "extract_12_fields": "Extract the person and company record from this profile: Maria Okafor is Head of "
    "Data at Brightwave Analytics, a fintech firm headquartered in Lisbon (brightwave.io). Reach her at "
    "maria.okafor@brightwave.io or +351 21 555 0199. Skills: Python, SQL, forecasting, team leadership. "
    "Speaks Portuguese, English and Igbo. Previously at Unbabel and Farfetch. She built the company's "
    "first real-time risk platform.",
}
SYSTEM = "You are a JSON API. Reply with one compact JSON value only."
TIGHT_SLACK = 2  # "just above the schema's minimum"
LONG_BUDGET = 160


def greedy(n: int) -> SamplingParams:
    return SamplingParams(max_new_tokens=n, temperature=0.0)


@pytest.fixture(scope="module")
def loop_prone_runs(real_engine, service, tokenizer):
    """(name, budget, strict) -> result: every loop-prone schema at a tight budget and at 160, strict
    and not, all in one batch."""
    keys, specs = [], []
    for name, text in LOOP_PRONE.items():
        handle = compile_schema(service, SCHEMAS[name])
        ids = chat_ids(tokenizer, text, SYSTEM)
        for budget in (handle.min_completion_tokens() + TIGHT_SLACK, LONG_BUDGET):
            for strict in (True, False):
                keys.append((name, budget, strict))
                specs.append(GenerateRequest(ids, greedy(budget), constraint=handle, strict=strict))
    return dict(zip(keys, real_engine.generate_many(specs, timeout=900)))


def complete_json(text: str):
    try:
        return True, json.loads(text)
    except json.JSONDecodeError:
        return False, None


@pytest.mark.e2e
@pytest.mark.parametrize("name", list(LOOP_PRONE))
@pytest.mark.parametrize("tight", [True, False], ids=["min+2", "160"])
def test_strict_loop_prone_output_is_complete_and_valid(loop_prone_runs, name, tight):
    (budget,) = {b for n, b, _ in loop_prone_runs if n == name and (b == LONG_BUDGET) != tight}
    strict, loose = loop_prone_runs[(name, budget, True)], loop_prone_runs[(name, budget, False)]
    ok, value = complete_json(strict.text)
    assert ok, f"{name}@{budget}: incomplete: {strict.text!r}"
    assert not errors_of(name, SCHEMAS[name], value), strict.text
    assert strict.completion_tokens <= budget
    # a strict value that completes ends `stop`, whoever closed it (OpenAI's parse() refuses `length`)
    assert strict.finish_reason == "stop", strict
    if tight:  # min+2 leaves no room to finish on its own: closing fired, and the result says so
        assert strict.closed_at_budget, strict
    if not strict.closed_at_budget:
        # closing did not fire: the model ended the value itself, or loop breaking steered it
        # to; either way it did so with room to spare
        assert strict.completion_tokens < budget
    if complete_json(loose.text)[0]:
        return
    # without strict mode the budget cut the value (or a loop ran into it)
    assert loose.finish_reason == "length" and loose.completion_tokens == budget
    assert strict.token_ids != loose.token_ids


@pytest.mark.e2e
def test_loop_breaking_ends_a_repeating_list_early(loop_prone_runs):
    """SmolLM2 repeats the keyword list until the budget without strict mode; with it, the
    repetition is detected and the array closed, long before closing would fire."""
    strict = loop_prone_runs[("loop_prone_string_array", LONG_BUDGET, True)]
    loose = loop_prone_runs[("loop_prone_string_array", LONG_BUDGET, False)]
    assert loose.finish_reason == "length" and not complete_json(loose.text)[0]
    assert strict.finish_reason == "stop" and strict.completion_tokens < LONG_BUDGET // 2
    assert not strict.closed_at_budget  # loop breaking closed it, not the budget
    assert complete_json(strict.text)[0]


@pytest.mark.e2e
def test_closing_fires_on_the_loop_prone_corpus(loop_prone_runs):
    """The loose runs show the problem the strict ones solve: values cut by the budget."""
    cut = [k for k, r in loop_prone_runs.items() if not k[2] and not complete_json(r.text)[0]]
    assert len(cut) >= len(LOOP_PRONE)  # at least every tight budget


@pytest.mark.e2e
@pytest.mark.parametrize("name", list(LOOP_PRONE))
def test_non_strict_output_is_never_altered(loop_prone_runs, name):
    """Non-strict output does not depend on the budget: the tight run is a prefix of the long one,
    cut exactly at the budget (no closing, no loop breaking)."""
    budgets = sorted({b for n, b, _ in loop_prone_runs if n == name})
    short, long = (loop_prone_runs[(name, b, False)] for b in budgets)
    assert short.finish_reason == "length" and short.completion_tokens == budgets[0]
    assert long.token_ids[: budgets[0]] == short.token_ids


@pytest.mark.e2e
def test_budget_below_the_smallest_instance_is_refused_at_once(engine_idle_check, service, tokenizer):
    handle = compile_schema(service, SCHEMAS["extract_12_fields"])
    need = handle.min_completion_tokens()
    assert need == len(handle.new_matcher().completion_plan()) and need > 20
    ids = chat_ids(tokenizer, LOOP_PRONE["extract_12_fields"], SYSTEM)
    before = engine_idle_check.stats().forward_passes
    with pytest.raises(EngineError) as e:
        engine_idle_check.generate_many([GenerateRequest(ids, greedy(need - 1), constraint=handle, strict=True)])
    assert f"needs {need} tokens" in e.value.message and f"at least {need}" in e.value.message
    assert e.value.param == "max_tokens"
    assert engine_idle_check.stats().forward_passes == before  # refused before any work
    # exactly the minimum is accepted, and completes
    r = engine_idle_check.generate_many([GenerateRequest(ids, greedy(need), constraint=handle, strict=True)])[0]
    assert json.loads(r.text) is not None and r.finish_reason == "stop" and r.closed_at_budget
    # a non-strict request with the same small budget is not refused (it is simply cut)
    r = engine_idle_check.generate_many([GenerateRequest(ids, greedy(need - 1), constraint=handle)])[0]
    assert r.finish_reason == "length" and r.completion_tokens == need - 1


WELL_BEHAVED = {
    "boolean_flags": "Classify this message: 'Win a free cruise!!! Send your bank details to claim.'",
    "enum_sentiment": "What is the sentiment of this review: 'The battery lasts two days and the screen is gorgeous.'",
    "person_basic": "Extract the person: Ada Lovelace, 36, ada@example.com.",
    "integer_range_small": "Pick a number from 1 to 10 for how urgent this is: 'server down for all users'.",
    "geojson_point": "Give the GeoJSON point for longitude 4.9, latitude 52.37.",
    "const_version_tag": "Wrap the payload 'hello' in a v1 message.",
    "tuple_prefix_items_coordinate": "Give the coordinate x=3, y=4 as a point.",
    "classification_multilabel": "Label this article: 'Central bank raises rates as inflation cools'.",
}


@pytest.mark.e2e
def test_well_behaved_output_is_identical_with_and_without_strict(engine_idle_check, service, tokenizer):
    specs, names = [], []
    for name, text in WELL_BEHAVED.items():
        handle = compile_schema(service, SCHEMAS[name])
        ids = chat_ids(tokenizer, text, SYSTEM)
        for strict in (True, False):
            for mode in ("verify", "off"):
                names.append((name, strict, mode))
                specs.append(GenerateRequest(ids, greedy(256), constraint=handle, strict=strict, jump_forward=mode))
    results = dict(zip(names, engine_idle_check.generate_many(specs, timeout=900)))
    for name in WELL_BEHAVED:
        for mode in ("verify", "off"):
            strict, loose = results[(name, True, mode)], results[(name, False, mode)]
            assert loose.finish_reason == "stop" and loose.completion_tokens < 64, (name, loose.text)
            assert strict.token_ids == loose.token_ids, (name, mode, strict.text, loose.text)
            assert strict.finish_reason == "stop" and not strict.closed_at_budget
            assert not errors_of(name, SCHEMAS[name], json.loads(strict.text))


@pytest.mark.e2e
def test_engine_is_idle_after_the_loop_prone_runs(loop_prone_runs, engine_idle_check):
    assert engine_idle_check.stats().running_requests == 0
