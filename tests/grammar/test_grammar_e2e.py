"""Constrained decoding end to end with the real SmolLM2 (greedy, strict): every corpus schema that
compiles and every corpus regex, in each jump-forward mode, gives output that parses and validates
(schemas) or full-matches (regexes); `verify` equals `off` token for token; the refused corpus
schemas are refused with a clear GrammarSpecError.

All requests of one mode go to the engine in one `generate_many` call (batched decode is several
times faster than one request at a time on a CPU), so the three modes cost three batches.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import jsonschema
import pytest

from grammar import GrammarService, GrammarSpec, GrammarSpecError
from grammar.validation.fidelity import routed_schema_fidelity
from runtime.api import GenerateRequest
from runtime.decode.sampling import SamplingParams
from tests.conftest import chat_ids

pytestmark = pytest.mark.e2e

DATA = Path(__file__).parents[1] / "data"
REFUSED = {
    k: v for k, v in json.loads((DATA / "schema_corpus_refusals.json").read_text()).items() if not k.startswith("_")
}
SCHEMAS = {p.stem: json.loads(p.read_text()) for p in sorted((DATA / "schema_corpus").glob("*.json"))}
COMPILED_NAMES = [name for name in SCHEMAS if name not in REFUSED]
REGEXES = {r["name"]: r["pattern"] for r in json.loads((DATA / "regex_corpus.json").read_text())}
EXAMPLES = json.loads((DATA / "schema_corpus_examples.json").read_text())
MODES = ("verify", "direct", "off")
MAX_NEW = 96  # strict closing guarantees completion, so a small budget is enough
SYSTEM = "You are a JSON API. Reply with one compact JSON value only."

# Keywords the compiling engine (xgrammar 0.2.x; llguidance where it is exact) does not enforce, as
# the fidelity report (grammar/validation/fidelity.py) classifies them (strict mode refuses these schemas at
# the gateway): for these schemas a validation error is accepted only where its schema path passes through one of them.
# Everything else (types, required, enums, consts, patterns, bounds, additionalProperties, ...)
# must hold. tests/grammar/validation/test_fidelity_classifier_cases.py pins the list this produces.
KNOWN_UNENFORCED = {
    name: {k.keyword for k in report.refused_in_strict}
    for name in COMPILED_NAMES
    if (report := routed_schema_fidelity(SCHEMAS[name])).refused_in_strict
}


def _schema_prompt(name: str, schema: dict) -> str:
    what = schema.get("title") or name.replace("_", " ")
    examples = EXAMPLES.get(name) or []
    if examples and isinstance(examples[0], dict) and examples[0]:
        facts = "; ".join(f"{k}: {json.dumps(v, ensure_ascii=False)}" for k, v in examples[0].items())
        return f"Turn this record into a JSON {what}. Record: {facts}"
    fields = ", ".join(list(schema.get("properties", {}))[:12])
    return f"Give a realistic example of a {what} as JSON" + (f" with the fields {fields}." if fields else ".")


def _regex_prompt(name: str) -> str:
    return f"Give one example of a {name.replace('_', ' ')}. Reply with the value only."


def unexplained_errors(name: str, schema: dict, value) -> list[str]:
    """Validation errors of `value` that the known-unenforced keywords of `name` do not explain."""
    validator = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)(schema)
    allowed = KNOWN_UNENFORCED.get(name, set())
    return [
        f"{e.message} (at {'/'.join(map(str, e.absolute_schema_path))})"
        for e in validator.iter_errors(value)
        if not allowed & set(map(str, e.absolute_schema_path))
    ]


@pytest.fixture(scope="module")
def corpus(service, tokenizer):
    """(kind, name, constraint, prompt ids, max_new_tokens) for every compiled schema and regex."""
    items = []
    for name in COMPILED_NAMES:
        handle = service.compile(GrammarSpec.json_schema(SCHEMAS[name]))
        items.append(("schema", name, handle, chat_ids(tokenizer, _schema_prompt(name, SCHEMAS[name]), SYSTEM)))
    for name, pattern in REGEXES.items():
        handle = service.compile(GrammarSpec.regex(pattern))
        items.append(("regex", name, handle, chat_ids(tokenizer, _regex_prompt(name), SYSTEM)))
    # a schema whose smallest instance needs more than MAX_NEW tokens gets room for it
    return [(kind, name, h, ids, max(MAX_NEW, (h.min_completion_tokens() or 0) + 16)) for kind, name, h, ids in items]


@pytest.fixture(scope="module")
def runs(real_engine, corpus):
    """mode -> {"results": {(kind, name): GenerateResult}, "passes", "seconds"}, one batch per mode."""
    out = {}
    for mode in MODES:
        specs = [
            GenerateRequest(
                ids,
                SamplingParams(max_new_tokens=n, temperature=0.0),
                constraint=h,
                jump_forward=mode,
                strict=True,
                # jump-forward alone: later modes would otherwise draft the earlier modes' answers
                speculative="off",
            )
            for _, _, h, ids, n in corpus
        ]
        before = real_engine.stats()
        t0 = time.perf_counter()
        results = real_engine.generate_many(specs, timeout=900)
        after = real_engine.stats()
        out[mode] = {
            "results": {(kind, name): r for (kind, name, *_), r in zip(corpus, results)},
            "passes": after.forward_passes - before.forward_passes,
            "seconds": time.perf_counter() - t0,
        }
    return out


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_refused_corpus_schema_gets_a_clear_error(service, name):
    with pytest.raises(GrammarSpecError) as e:
        service.compile(GrammarSpec.json_schema(SCHEMAS[name]))
    assert e.value.pointer == REFUSED[name]["pointer"]
    assert REFUSED[name]["message"] in e.value.message
    assert e.value.param == "response_format"


def test_every_other_corpus_schema_compiles(corpus):
    assert {name for kind, name, *_ in corpus if kind == "schema"} == set(COMPILED_NAMES)
    assert len(COMPILED_NAMES) >= 60


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", COMPILED_NAMES)
def test_schema_output_parses_and_validates(runs, mode, name):
    r = runs[mode]["results"][("schema", name)]
    assert r.finish_reason in ("stop", "length"), r
    try:
        value = json.loads(r.text)
    except json.JSONDecodeError as e:
        pytest.fail(f"{mode}/{name}: not JSON ({e}): {r.text!r}")
    errors = unexplained_errors(name, SCHEMAS[name], value)
    assert not errors, f"{mode}/{name}: {errors}: {r.text!r}"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", sorted(REGEXES))
def test_regex_output_full_matches(runs, mode, name):
    r = runs[mode]["results"][("regex", name)]
    assert r.finish_reason in ("stop", "length"), r
    assert re.fullmatch(REGEXES[name], r.text), f"{mode}/{name}: {r.text!r}"


@pytest.mark.parametrize("kind,name", [("schema", n) for n in COMPILED_NAMES] + [("regex", n) for n in sorted(REGEXES)])
def test_verify_equals_off_token_for_token(runs, kind, name):
    verify, off = runs["verify"]["results"][(kind, name)], runs["off"]["results"][(kind, name)]
    assert verify.token_ids == off.token_ids, (verify.text, off.text)
    assert verify.finish_reason == off.finish_reason


def test_jump_forward_saves_forward_passes(runs):
    # drafts of forced text go into the KV cache in the same pass as the model's next token
    assert runs["verify"]["passes"] < runs["off"]["passes"]
    assert runs["direct"]["passes"] < runs["off"]["passes"]


def test_engine_is_idle_after_the_corpus(runs, engine_idle_check):
    stats = engine_idle_check.stats()
    assert stats.running_requests == 0 and stats.waiting_requests == 0


def test_drafts_learn_the_models_split_and_keep_verify_exact(real_engine, tokenizer, engine_idle_check):
    """A fresh service (nothing learned): the second identical batch drafts the way the model wrote
    the first, so fewer draft tokens are rejected, and the output stays the model's own."""
    svc = GrammarService(tokenizer, real_engine.model_config.vocab_size)
    try:
        handle = svc.compile(GrammarSpec.json_schema(SCHEMAS["extract_12_fields"]))
        prompts = [
            chat_ids(tokenizer, f"Extract the person and company record: {who}", SYSTEM)
            for who in (
                "Ada Lovelace, analyst at Babbage & Co (engines, babbage.co.uk), London, ada@babbage.co.uk.",
                "Kenji Watanabe, engineer at Hoshino Robotics (hoshino-robotics.jp), Osaka, kenji@hoshino.jp.",
            )
        ]
        runs = []
        for mode in ("verify", "verify", "off"):
            specs = [
                GenerateRequest(
                    ids,
                    SamplingParams(max_new_tokens=96, temperature=0.0),
                    constraint=handle,
                    jump_forward=mode,
                    strict=True,
                )
                for ids in prompts
            ]
            before = real_engine.stats()
            results = real_engine.generate_many(specs, timeout=600)
            after = real_engine.stats()
            runs.append(([r.token_ids for r in results], after.jump_forward_rejected - before.jump_forward_rejected))
        (first, rejected_first), (second, rejected_second), (off, _) = runs
        assert len(svc.draft_splitter) > 0
        assert rejected_second < rejected_first, (rejected_first, rejected_second)
        assert first == second == off
    finally:
        svc.close()


def test_sampled_requests_verify_drafts_and_stay_valid(real_engine, tokenizer, engine_idle_check):
    """Sampling (temperature 1, seeded) with verify jump-forward, batched with greedy requests:
    drafts are accepted with the masked probability (speculative sampling), so every output is
    still valid, and the same seed gives the same output, with or without drafts."""
    svc = GrammarService(tokenizer, real_engine.model_config.vocab_size)
    try:
        schema = SCHEMAS["person_basic"]
        handle = svc.compile(GrammarSpec.json_schema(schema))
        ids = chat_ids(tokenizer, "Extract the person: Ada Lovelace, 36, ada@example.com.", SYSTEM)

        def batch(mode="verify"):
            sampled = [
                GenerateRequest(
                    ids,
                    SamplingParams(max_new_tokens=64, temperature=1.0, seed=s),
                    constraint=handle,
                    jump_forward=mode,
                    strict=True,
                )
                for s in (1, 2)
            ]
            greedy = [
                GenerateRequest(
                    ids,
                    SamplingParams(max_new_tokens=64, temperature=0.0),
                    constraint=handle,
                    jump_forward="verify",
                    strict=True,
                )
            ]
            before = real_engine.stats()
            results = real_engine.generate_many(sampled + greedy, timeout=600)
            drafted = real_engine.stats().jump_forward_tokens - before.jump_forward_tokens
            return results, drafted

        first, drafted = batch()
        second, _ = batch()  # drafted differently: the splitter learned from the first
        without_drafts, _ = batch("off")
        alone = real_engine.generate_many(
            [
                GenerateRequest(
                    ids,
                    SamplingParams(max_new_tokens=64, temperature=1.0, seed=1),
                    constraint=handle,
                    jump_forward="verify",
                    strict=True,
                )
            ],
            timeout=600,
        )[0]
        assert drafted > 0
        for r in first:
            assert not unexplained_errors("person_basic", schema, json.loads(r.text)), r.text
        assert [r.token_ids for r in first] == [r.token_ids for r in second]
        assert [r.token_ids for r in first[:2]] == [r.token_ids for r in without_drafts[:2]]
        # each request reads its own logits rows in a batch: the same as when it runs alone
        assert alone.token_ids == first[0].token_ids
    finally:
        svc.close()
