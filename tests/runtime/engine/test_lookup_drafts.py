"""Prompt-lookup drafts through the real engine and SmolLM2: outputs identical with them off
(greedy, sampled with a seed, under a JSON schema, batched), fewer forward passes where the answer
copies the prompt or an earlier answer to a prompt that begins alike, and a clear refusal of an
unknown mode."""

from __future__ import annotations

from dataclasses import replace

import pytest

from grammar import GrammarSpec
from runtime.api import EngineError, GenerateRequest
from runtime.decode.lookup import SharedDrafts
from runtime.decode.row_cost import MAX_SHARE, MIN_SHARE, RowCost
from runtime.decode.sampling import SamplingParams
from tests.conftest import chat_ids

pytestmark = pytest.mark.e2e

DIRECTORY = (
    "Staff directory.\n"
    "Profile 1. Amara Okafor works as Head of Logistics at Tidewater Freight, Lagos; email amara@tidewater.ng.\n"
    "Profile 2. Lukas Brenner works as Senior Data Engineer at Nordlicht Energie, Hamburg; email lukas@nordlicht.de.\n"
    "Profile 3. Sofia Marquez works as Chief Sommelier at Bodega Alta Vista, Mendoza; email sofia@altavista.ar.\n"
)
RECORD = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "title": {"type": "string"},
        "company": {"type": "string"},
        "city": {"type": "string"},
        "email": {"type": "string"},
    },
    "required": ["name", "title", "company", "city", "email"],
    "additionalProperties": False,
}


def copy_prompt(tokenizer, who: str) -> list[int]:
    return chat_ids(tokenizer, f"Copy the line of {who} from the directory, word for word.", system=DIRECTORY)


def passes_and_output(engine, spec: GenerateRequest):
    before = engine.stats()
    result = engine.generate_many([spec], timeout=300)[0]
    after = engine.stats()
    return (
        result,
        after.forward_passes - before.forward_passes,
        after.lookup_accepted_tokens - before.lookup_accepted_tokens,
    )


def test_greedy_copying_takes_fewer_passes_and_the_same_tokens(engine_idle_check, tokenizer):
    ids = copy_prompt(tokenizer, "Lukas Brenner")
    sampling = SamplingParams(max_new_tokens=48, temperature=0.0)
    off, off_passes, off_kept = passes_and_output(engine_idle_check, GenerateRequest(ids, sampling, speculative="off"))
    on, on_passes, on_kept = passes_and_output(engine_idle_check, GenerateRequest(ids, sampling, speculative="ngram"))
    assert on.token_ids == off.token_ids and on.finish_reason == off.finish_reason
    assert off_kept == 0
    assert on_kept > 0
    assert on_passes < off_passes


def test_sampled_output_with_a_seed_does_not_depend_on_drafts(engine_idle_check, tokenizer):
    ids = copy_prompt(tokenizer, "Sofia Marquez")
    sampling = SamplingParams(max_new_tokens=40, temperature=0.7, top_p=0.9, seed=11)
    off = engine_idle_check.generate(ids, sampling, speculative="off")
    on = engine_idle_check.generate(ids, sampling, speculative="ngram")
    assert on.token_ids == off.token_ids


def test_a_json_schema_answer_is_the_same_with_drafts_batched_or_alone(engine_idle_check, service, tokenizer):
    handle = service.compile(GrammarSpec.json_schema(RECORD))
    people = ["Amara Okafor", "Lukas Brenner", "Sofia Marquez"]
    sampling = SamplingParams(max_new_tokens=96, temperature=0.0)

    def specs(mode):
        return [
            GenerateRequest(
                chat_ids(tokenizer, f"Give the record of {p} as JSON.", system=DIRECTORY),
                sampling,
                constraint=handle,
                strict=True,
                speculative=mode,
            )
            for p in people
        ]

    before = engine_idle_check.stats()
    batched_on = engine_idle_check.generate_many(specs("ngram"), timeout=300)
    kept = engine_idle_check.stats().lookup_accepted_tokens - before.lookup_accepted_tokens
    alone_off = [engine_idle_check.generate_many([s], timeout=300)[0] for s in specs("off")]
    for on, off in zip(batched_on, alone_off):
        assert on.token_ids == off.token_ids
        assert on.finish_reason == off.finish_reason == "stop"
    assert kept > 0  # the values copy the directory


def test_an_unknown_mode_is_refused(engine_idle_check, tokenizer):
    with pytest.raises(EngineError) as e:
        engine_idle_check.generate(chat_ids(tokenizer, "Hi"), SamplingParams(max_new_tokens=4), speculative="eagle")
    assert e.value.param == "speculative"


def test_decode_steps_are_fitted_into_the_drafts_row_cost(engine_idle_check, tokenizer):
    cost = engine_idle_check.lookup_settings.row_cost
    assert cost.measured  # the default: measured, not fixed
    seen = cost.steps
    ids = copy_prompt(tokenizer, "Amara Okafor")
    engine_idle_check.generate(ids, SamplingParams(max_new_tokens=32, temperature=0.0), speculative="ngram")
    assert cost.steps > seen  # its decode steps were observed
    share = engine_idle_check.stats().lookup_row_cost
    assert share == cost.share and MIN_SHARE <= share <= MAX_SHARE
    print(f"measured row cost share {share:.3f} after {cost.steps} decode steps")


def test_a_request_drafts_the_answer_an_earlier_one_with_its_prompt_start_wrote(
    engine_idle_check, service, tokenizer, monkeypatch
):
    # a fixed low row cost and empty groups, so the draft lengths depend on this test's requests only
    settings = replace(engine_idle_check.lookup_settings, row_cost=RowCost.fixed(0.05), shared=SharedDrafts())
    monkeypatch.setattr(engine_idle_check, "lookup_settings", settings)
    handle = service.compile(GrammarSpec.json_schema(RECORD))
    ids = chat_ids(tokenizer, "Give the record of Lukas Brenner as JSON.", system=DIRECTORY)
    sampling = SamplingParams(max_new_tokens=96, temperature=0.0)

    def spec(namespace: str) -> GenerateRequest:
        return GenerateRequest(ids, sampling, constraint=handle, strict=True, speculative="ngram", namespace=namespace)

    first, first_passes, first_kept = passes_and_output(engine_idle_check, spec(""))
    again, again_passes, again_kept = passes_and_output(engine_idle_check, spec(""))
    # another cache namespace is another group: it drafts from its own prompt and output only
    apart, apart_passes, apart_kept = passes_and_output(engine_idle_check, spec("tenant-b"))
    assert again.token_ids == first.token_ids == apart.token_ids
    assert (apart_kept, apart_passes) == (first_kept, first_passes)
    assert again_kept > first_kept  # (its passes are fewer anyway: its prompt is cached)
    print(f"passes: first {first_passes}, same group again {again_passes}; drafts kept {first_kept} -> {again_kept}")
