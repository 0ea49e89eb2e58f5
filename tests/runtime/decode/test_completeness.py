"""Strict responses always complete: budget-aware closing and loop breaking.

Unit tests of runtime/decode/completeness.py (repetition detectors, the CompletionGuard state machine on a
fake matcher, the engine's `loop_breaking` switch) and grammar/checks/closing.py (shortest completion
plans, closing masks); then the real SmolLM2, greedy: loop-prone corpus schemas at tight budgets
give complete, valid JSON; a budget below the schema's smallest instance is refused at once;
well-behaved output is identical with and without strict mode; non-strict output is never altered.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest
import torch
import xgrammar as xgr

from grammar import GrammarService, GrammarSpec
from grammar.checks.closing import allowed_subset
from runtime.api import EngineError, GenerateRequest
from runtime.decode.completeness import (
    CLOSING_MARGIN,
    FAR_TOKENS,
    MAX_DIGITS,
    CompletionGuard,
    has_periodic_suffix,
    runaway_number,
)
from runtime.decode.sampling import SamplingParams
from tests.conftest import chat_ids

DATA = Path(__file__).parents[2] / "data"
REFUSED = {k for k in json.loads((DATA / "schema_corpus_refusals.json").read_text()) if not k.startswith("_")}
SCHEMAS = {p.stem: json.loads(p.read_text()) for p in sorted((DATA / "schema_corpus").glob("*.json"))}
REGEXES = {r["name"]: r["pattern"] for r in json.loads((DATA / "regex_corpus.json").read_text())}
# see tests/grammar/test_grammar_e2e.py: keywords xgrammar compiles without enforcing them
UNENFORCED = {"if_then_else_country_postal": {"if", "then", "else"}, "numeric_bounds_sensor": {"multipleOf"}}


def errors_of(name: str, schema: dict, value) -> list[str]:
    validator = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)(schema)
    skip = UNENFORCED.get(name, set())
    return [e.message for e in validator.iter_errors(value) if not skip & set(map(str, e.absolute_schema_path))]


# ==== runtime/decode/completeness.py: detectors ==========================================================


def test_periodic_suffix_needs_three_copies_over_twelve_tokens():
    assert has_periodic_suffix([7] * 12)
    assert not has_periodic_suffix([7] * 11)  # too short a span
    assert has_periodic_suffix([1, 2] + [5, 6, 7, 8] * 3)  # period 4, 3 copies
    assert not has_periodic_suffix([5, 6, 7, 8] * 2 + [5, 6, 7, 9])  # broken at the end
    assert has_periodic_suffix(list(range(16)) * 3)  # the longest period
    assert not has_periodic_suffix(list(range(17)) * 2)  # period 17 > MAX_PERIOD
    assert not has_periodic_suffix(list(range(40)))
    assert not has_periodic_suffix([])


def test_runaway_number_counts_trailing_digits_only():
    assert not runaway_number("1" * (MAX_DIGITS - 1))
    assert runaway_number("x" + "1" * MAX_DIGITS)  # the run is full: the number ends next
    assert not runaway_number("1" * 20 + ".")  # the number ended
    assert not runaway_number("abc")
    assert not runaway_number("")


# ==== runtime/decode/completeness.py: the guard on a fake matcher ========================================


class FakeMatcher:
    """A matcher whose shortest completion is `plan` (a list of ids), consumed token by token when
    the output follows it; a token in `detours` (another closer, say) puts one token in front of
    the plan; any other token (free text) leaves it as is. Records fills."""

    def __init__(self, plan: list[int], detours: frozenset[int] = frozenset()):
        self.plan = list(plan)
        self.detours = detours
        self.fills: list[tuple] = []
        self.plans_made = 0
        self.bound_after: dict[int, int] = {}

    # the interface CompletionGuard uses
    def completion_plan(self):
        self.plans_made += 1
        return list(self.plan)

    def completion_bound(self):
        return len(self.plan)

    def completion_bound_after(self, token_id):
        return self.bound_after.get(token_id, max(0, len(self.plan) - 1))

    def may_expand(self, token_id):
        return token_id in self.bound_after

    def fill_bitmask(self, mask, row):
        self.fills.append(("plain",))

    def fill_closing_bitmask(self, mask, row, tight=False, plan_token=None):
        self.fills.append(("closing", tight, plan_token))

    def fill_plan_bitmask(self, mask, row, token_id):
        self.fills.append(("plan", token_id))

    def fill_value_closing_bitmask(self, mask, row):
        self.fills.append(("value",))
        return True

    # test driver: the engine's accept
    def take(self, token_id):
        if self.plan and token_id == self.plan[0]:
            self.plan.pop(0)
        elif token_id in self.detours:
            self.plan = [900] + self.plan


def drive(guard: CompletionGuard, m: FakeMatcher, out: list[int], max_new: int, token: int | None = None) -> int:
    """One decoding step as the engine runs it; returns the token taken (the model's `token`, or
    the one token a plan mask allows)."""
    guard.before_choice(m, len(out), max_new)
    mask = torch.full((1, 4), -1, dtype=torch.int32)
    guard.fill_mask(m, mask, 0)
    kind = m.fills[-1]
    if kind[0] == "plan":
        token = kind[1]
    elif token is None:
        token = m.plan[0]
    m.take(token)
    out.append(token)
    guard.after_token(out, "", closed_value=False)
    return token


def test_guard_stays_out_of_the_way_far_from_the_budget():
    g, m, out = CompletionGuard(), FakeMatcher([1, 2, 3, 4]), []
    for i in range(20):
        drive(g, m, out, max_new=200, token=50 + i)
    assert not g.closing and not g.close_value
    assert all(f == ("plain",) for f in m.fills)
    assert m.plans_made <= 2  # the bound is re-checked every RECHECK_EVERY tokens only


class PlanlessMatcher(FakeMatcher):
    """A state from which the planner finds no completion within its limit (a large schema whose
    greedy plan writes optional properties): each try walked MAX_PLAN_TOKENS steps."""

    def completion_plan(self):
        self.plans_made += 1
        return None


def test_a_failed_plan_is_tried_again_every_recheck_only():
    """Where no plan was found the guard re-planned on every token: a second or more of grammar
    work per token on SchemaStore's citation-file-format (issue #42 item 2)."""
    g, m, out = CompletionGuard(), PlanlessMatcher([]), []
    for i in range(48):
        drive(g, m, out, max_new=64, token=50 + i)
    assert m.plans_made == 3  # at 0, 16 and 32 tokens
    assert not g.closing and g.bound is None
    g.restart()  # a rewind forgets what was known: plan at once
    drive(g, m, out, max_new=64, token=7)
    assert m.plans_made == 4


def test_guard_closes_when_the_budget_comes_within_the_bound():
    plan = [11, 12, 13, 14, 15]
    g, m, out = CompletionGuard(), FakeMatcher(plan), []
    max_new = 20
    while len(out) < max_new - len(plan) - CLOSING_MARGIN:
        drive(g, m, out, max_new, token=60 + len(out))  # free text: the plan stays ahead
        assert not g.closing
    drive(g, m, out, max_new, token=11)  # remaining == bound + margin: closing begins
    assert g.closing and not g.tight
    assert m.fills[-1] == ("closing", False, 11)  # the plan's class, the model choosing
    while m.plan:
        drive(g, m, out, max_new)
    assert out[-len(plan) :] == plan and len(out) <= max_new


def test_guard_follows_the_stored_plan_token_for_token_when_tight():
    plan = [21, 22, 23, 24]
    g, m, out = CompletionGuard(), FakeMatcher(plan), []
    max_new = 30
    while len(out) < max_new - len(plan) - 1:
        drive(g, m, out, max_new, token=70 + len(out))
    made = m.plans_made
    taken = [drive(g, m, out, max_new) for _ in plan]
    assert taken == plan and len(out) == max_new - 1
    assert [f for f in m.fills[-len(plan) :]] == [("plan", t) for t in plan]
    assert m.plans_made == made + 1  # planned once, then followed


def test_forced_tokens_go_in_unchosen_only_on_the_plan_while_closing():
    """Direct jump-forward inserts forced tokens without the model: far from the budget any
    forced token may go in; once closing, only the plan's next token (a longer split of the same
    text would spend budget the plan counted on)."""
    plan = [41, 42, 43]
    g, m, out = CompletionGuard(), FakeMatcher(plan), []
    max_new = 12
    g.before_choice(m, len(out), max_new)
    assert not g.closing and g.allows_unchosen(m, 77, max_new)
    while len(out) < max_new - len(plan) - CLOSING_MARGIN:
        drive(g, m, out, max_new, token=60 + len(out))
    g.before_choice(m, len(out), max_new)
    assert g.closing
    assert g.allows_unchosen(m, 41, max_new - len(out))
    assert not g.allows_unchosen(m, 77, max_new - len(out))


def test_guard_replans_when_the_model_leaves_the_plan():
    g, m, out = CompletionGuard(), FakeMatcher([31, 32, 33], detours=frozenset({99})), []
    max_new = 12
    while not g.closing:
        drive(g, m, out, max_new, token=80 + len(out))
    made = m.plans_made
    assert not g.tight
    drive(g, m, out, max_new, token=99)  # another allowed token of the plan's class
    assert g.plan is None  # left the plan
    drive(g, m, out, max_new)
    assert m.plans_made > made and g.plan == [900, 31, 32, 33]
    while m.plan:
        drive(g, m, out, max_new)
    assert out[-3:] == [31, 32, 33] and len(out) <= max_new


def test_guard_vets_expanding_choices_near_the_budget():
    g, m = CompletionGuard(), FakeMatcher([1] * 10)
    m.bound_after = {5: 40, 6: 8}  # 5 would open a big new item, 6 a small one
    g.before_choice(m, produced=0, max_new=30)
    assert not g.allows(m, 5, remaining=30)  # 40 > 29 tokens left after it
    assert g.allows(m, 6, remaining=30)
    assert g.allows(m, 7, remaining=30)  # not an expanding token: never checked
    g.before_choice(m, produced=0, max_new=FAR_TOKENS + 1)
    assert g.allows(m, 5, remaining=FAR_TOKENS + 1)  # farther than any bound can rise: not checked
    assert g.fallback_token(m) == 1


def test_a_checked_token_that_raises_the_bound_brings_the_recheck_forward():
    """Issue #16 (Kubernetes eviction-lifecycle at 384 tokens): with 44 tokens left and a bound of
    7 the model opened a new array item whose plan was 34 tokens; the guard kept the bound of 7
    until its next scheduled re-check, 16 tokens later, when 32 were left: too late to close. The
    bound a check finds is now the guard's bound once the token is taken."""
    g, m, out = CompletionGuard(loop_breaking=False), FakeMatcher([1] * 7), []
    m.bound_after = {5: 34}  # 5 opens a new item
    max_new = 60
    while len(out) < 16:
        drive(g, m, out, max_new, token=80 + len(out))  # free text: the bound stays 7
    assert not g.closing and g.bound == 7
    g.before_choice(m, len(out), max_new)
    assert g.allows(m, 5, max_new - len(out))  # 44 left, 34 needed after it: allowed (checked)
    m.plan = [1] * 34
    out.append(5)
    g.after_token(out, "", closed_value=False)
    assert g.bound == 34 and not g.closing
    while not g.closing:
        drive(g, m, out, max_new, token=80 + len(out))
    assert max_new - len(out) >= len(m.plan)  # closing began while the plan still fits
    while m.plan:
        drive(g, m, out, max_new)
    assert len(out) <= max_new


def test_loop_breaking_closes_the_current_value_once():
    g, m, out = CompletionGuard(), FakeMatcher([1, 2]), []
    for _ in range(4):
        for t in (41, 42, 43):
            out.append(t)
            g.after_token(out, "", closed_value=False)
    assert g.close_value and g.loops_broken == 1
    mask = torch.full((1, 4), -1, dtype=torch.int32)
    g.before_choice(m, len(out), 500)
    g.fill_mask(m, mask, 0)
    assert m.fills[-1] == ("value",)
    out.append(44)
    g.after_token(out, "", closed_value=True)  # a closer ended the value
    assert not g.close_value
    g.fill_mask(m, mask, 0)
    assert m.fills[-1] == ("plain",)


def test_runaway_number_triggers_loop_breaking():
    g = CompletionGuard()
    g.after_token([1, 2, 3], '{"n":' + "9" * (MAX_DIGITS + 1), closed_value=False)
    assert g.close_value


def test_loop_breaking_off_never_steers():
    g, out = CompletionGuard(loop_breaking=False), []
    for _ in range(20):
        out.append(7)
        g.after_token(out, "7" * len(out), closed_value=False)
    assert not g.close_value and g.loops_broken == 0


def test_loop_breaking_waits_while_closing():
    g, out = CompletionGuard(closing=True), []
    for _ in range(20):
        out.append(7)
        g.after_token(out, "", closed_value=False)
    assert not g.close_value


def test_engine_wires_loop_breaking_and_strict_into_the_guard(tiny_model_dir, tokenizer):
    from runtime.engine.engine import Engine

    for flag in (True, False):
        engine = Engine(model=str(tiny_model_dir), kv_pool_tokens=2048, loop_breaking=flag)
        svc = GrammarService(engine.tokenizer, engine.model_config.vocab_size)
        handle = svc.compile(GrammarSpec.json_schema({"type": "object", "properties": {"a": {"type": "string"}}}))
        strict = engine.new_request(engine.validate(GenerateRequest([1, 2, 3], constraint=handle, strict=True)), print)
        loose = engine.new_request(engine.validate(GenerateRequest([1, 2, 3], constraint=handle)), print)
        assert strict.guard is not None and strict.guard.loop_breaking is flag
        assert loose.guard is None  # non-strict requests are never steered
        svc.close()


# ==== grammar/checks/closing.py ==========================================================================


def compile_schema(service, schema):
    return service.compile(GrammarSpec.json_schema(schema))


def obj(props: dict, required=None) -> dict:
    return {
        "type": "object",
        "properties": props,
        "required": list(required if required is not None else props),
        "additionalProperties": False,
    }


@pytest.mark.parametrize(
    "schema,minimal",
    [
        (obj({"a": {"type": "string"}}), '{"a":""}'),
        (obj({"n": {"type": "integer"}}), '{"n":0}'),
        (obj({"ok": {"type": "boolean"}}), '{"ok":false}'),
        (obj({"tags": {"type": "array", "items": {"type": "string"}}}), '{"tags":[]}'),
        (obj({"a": {"type": "string"}, "b": {"type": "string"}}), '{"a":"","b":""}'),
        (obj({"inner": obj({"x": {"type": "string"}})}), '{"inner":{"x":""}}'),
        (obj({"a": {"type": "string"}, "opt": {"type": "string"}}, required=["a"]), '{"a":""}'),
        (obj({"n": {"type": "integer", "minimum": 1}, "m": {"type": "integer"}}), '{"n":1,"m":0}'),
    ],
)
def test_completion_bound_is_the_minimal_instance(service, tokenizer, schema, minimal):
    """The bound is the token count of the path to the minimal instance (forced text in the
    tokenizer's own tokens, then closers such as `"}`): never more than the tokenizer's encoding
    of the whole minimal instance."""
    handle = compile_schema(service, schema)
    matcher = handle.new_matcher()
    plan = matcher.completion_plan()
    assert tokenizer.decode(plan) == minimal
    assert matcher.completion_bound() == len(plan) == handle.min_completion_tokens()
    assert len(plan) <= len(tokenizer.encode(minimal, add_special_tokens=False))
    for t in plan:  # the path is the grammar's own
        assert matcher.accept(t)
    assert matcher.is_completed() and matcher.completion_bound() == 0


def test_completion_bound_of_one_string_property(service, tokenizer):
    matcher = compile_schema(service, obj({"a": {"type": "string"}})).new_matcher()
    pieces = tokenizer.convert_ids_to_tokens(matcher.completion_plan())
    assert pieces == ['{"', "a", '":"', '"}']  # forced `{"a":"`, then one closer
    assert matcher.completion_bound() == 4


def test_completion_bound_counts_from_the_current_state(service, tokenizer):
    handle = compile_schema(service, obj({"a": {"type": "string"}, "b": {"type": "integer"}}))
    matcher = handle.new_matcher()
    for t in tokenizer.encode('{"a":"hello world', add_special_tokens=False):
        assert matcher.accept(t)
    plan = matcher.completion_plan()
    assert tokenizer.decode(plan) == '","b":0}'
    assert matcher.completion_bound() == len(plan)


@pytest.mark.parametrize("name", [n for n in SCHEMAS if n not in REFUSED])
def test_every_corpus_schema_has_a_valid_shortest_completion(service, tokenizer, name):
    handle = compile_schema(service, SCHEMAS[name])  # xgrammar's or llguidance's: the same planner
    plan = handle.new_matcher().completion_plan()
    assert plan is not None, name
    assert handle.min_completion_tokens() == len(plan)
    value = json.loads(tokenizer.decode(plan))
    if getattr(handle, "engine", "xgrammar") == "llguidance":  # exact: every keyword holds
        jsonschema.validators.validator_for(SCHEMAS[name], default=jsonschema.Draft202012Validator)(
            SCHEMAS[name]
        ).validate(value)
    assert not errors_of(name, SCHEMAS[name], value), (name, value)


@pytest.mark.parametrize("name", sorted(REGEXES))
def test_every_corpus_regex_has_a_matching_shortest_completion(service, tokenizer, name):
    plan = service.compile(GrammarSpec.regex(REGEXES[name])).new_matcher().completion_plan()
    assert plan is not None and re.fullmatch(REGEXES[name], tokenizer.decode(plan)), name


def allowed_ids(mask: torch.Tensor, vocab: int) -> set[int]:
    return set(allowed_subset(mask[0], torch.arange(vocab)).tolist())


def test_closing_mask_is_the_stop_token_once_complete(service, tokenizer):
    handle = compile_schema(service, obj({"a": {"type": "string"}}))
    matcher = handle.new_matcher()
    for t in tokenizer.encode('{"a":"x"}', add_special_tokens=False):
        assert matcher.accept(t)
    mask = xgr.allocate_token_bitmask(1, len(tokenizer))
    matcher.fill_closing_bitmask(mask, 0)
    assert allowed_ids(mask, len(tokenizer)) == set(service.stop_token_ids)


def test_closing_mask_inside_a_string_ends_it(service, tokenizer):
    handle = compile_schema(service, obj({"a": {"type": "string"}, "b": {"type": "string"}}))
    matcher = handle.new_matcher()
    for t in tokenizer.encode('{"a":"hello', add_special_tokens=False):
        assert matcher.accept(t)
    vocab = len(tokenizer)
    mask = xgr.allocate_token_bitmask(1, vocab)
    matcher.fill_closing_bitmask(mask, 0)
    loose = allowed_ids(mask, vocab)
    quote = tokenizer.convert_tokens_to_ids('"')
    assert quote in loose
    assert all(tokenizer.convert_ids_to_tokens(t).startswith('"') for t in loose)
    matcher.fill_closing_bitmask(mask, 0, tight=True)
    assert allowed_ids(mask, vocab) == {matcher.completion_plan()[0]}


def test_value_closing_allows_the_quote_inside_a_free_string(service, tokenizer):
    handle = compile_schema(service, obj({"notes": {"type": "array", "items": {"type": "string"}}}))
    matcher = handle.new_matcher()
    for t in tokenizer.encode('{"notes":["again and again', add_special_tokens=False):
        assert matcher.accept(t)
    vocab = len(tokenizer)
    mask = xgr.allocate_token_bitmask(1, vocab)
    assert matcher.fill_value_closing_bitmask(mask, 0)
    allowed = allowed_ids(mask, vocab)
    pieces = {tokenizer.convert_ids_to_tokens(t) for t in allowed}
    assert '"' in pieces and '"]' in pieces
    assert "]" not in pieces and "a" not in pieces  # inside the string `]` is just a character


def test_value_closing_ends_a_runaway_number(service, tokenizer):
    handle = compile_schema(service, obj({"xs": {"type": "array", "items": {"type": "integer"}}}))
    matcher = handle.new_matcher()
    for t in tokenizer.encode('{"xs":[123456', add_special_tokens=False):
        assert matcher.accept(t)
    mask = xgr.allocate_token_bitmask(1, len(tokenizer))
    assert matcher.fill_value_closing_bitmask(mask, 0)
    pieces = {tokenizer.convert_ids_to_tokens(t) for t in allowed_ids(mask, len(tokenizer))}
    assert "]" in pieces and "]}" in pieces
    assert not any(p.isdigit() for p in pieces)


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


# ==== the guard on the real grammar, a scripted model ===============================================

REFS = obj(
    {
        "refs": {"type": "array", "items": obj({k: {"type": "string"} for k in "abcdefgh"})},
        "spec": {"type": ["object", "null"], "properties": {"x": {"type": "string"}}},
    },
    required=["refs"],
)
REFS_ITEM = "{" + ",".join(f'"{k}":"lifecycle.k8s.io/v1alpha1.Lifecycle"' for k in "abcdefgh") + "}"


def scripted_strict_run(handle, tokenizer, script: list[int], max_new: int) -> list[int]:
    """Decode as runtime/decode/decoding.py does for a strict greedy request whose model wants to write
    `script` (then its plan's tokens): the guard's mask, its vetting of each choice (a refused
    choice falls back to the plan's next token), and its bookkeeping after each token."""
    matcher, guard, out = handle.new_matcher(), CompletionGuard(loop_breaking=False), []
    mask = xgr.allocate_token_bitmask(1, len(tokenizer))
    while len(out) < max_new and not matcher.is_completed():
        guard.before_choice(matcher, len(out), max_new)
        mask.fill_(-1)
        guard.fill_mask(matcher, mask, 0)
        want = script[len(out)] if len(out) < len(script) else None
        ok = want is not None and bool(allowed_subset(mask[0], torch.tensor([want])).numel())
        tok = want if ok and guard.allows(matcher, want, max_new - len(out)) else guard.fallback_token(matcher)
        assert tok is not None and matcher.accept(tok), (tokenizer.decode(out), tok)
        out.append(tok)
        guard.after_token(out, "", matcher.closes_value(tok))
    return out


def test_strict_output_completes_when_the_model_opens_a_big_item_near_the_budget(service, tokenizer):
    """Issue #16: a model that keeps adding array items of eight required properties. Whatever
    the budget (above the smallest instance), the strict output is complete and valid: a new
    item raises the bound by ~30 tokens at once, and the guard now knows it at once."""
    handle = compile_schema(service, REFS)
    need = handle.min_completion_tokens()
    script = tokenizer.encode('{"refs":[' + ",".join([REFS_ITEM] * 20), add_special_tokens=False)
    for max_new in range(need + 40, need + 160, 7):
        out = scripted_strict_run(handle, tokenizer, script, max_new)
        text = tokenizer.decode(out)
        assert len(out) <= max_new and json.loads(text)["refs"], (max_new, text)
        assert not errors_of("refs", REFS, json.loads(text)), text
