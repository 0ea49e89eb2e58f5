"""Logprobs from the real SmolLM2 through the real runtime, against two references, each the logits
for the same tokens, masked by a fresh matcher of the same grammar, then log-softmax (what
runtime/decode/logprobs.py says Jumpgate reports):
- a recompute: the engine's own model on prompt + output in one prefill pass, in whatever weight
  format the engine runs. Batch-invariant attention and row-invariant linear kernels make it equal
  to what the engine reported from its decode steps, drafts and batches;
- transformers' fp32 forward (an independent implementation): for an engine running fp32."""

from __future__ import annotations

import math

import pytest
import torch

from grammar import GrammarSpec
from runtime.api import GenerateRequest
from runtime.decode.sampler import apply_token_bitmask
from runtime.decode.sampling import SamplingParams
from runtime.forward_batch import ForwardBatch
from runtime.kvcache.pool import KVPool
from tests.conftest import chat_ids

pytestmark = pytest.mark.e2e

TOL = 2e-3  # our fp32 runtime vs transformers' fp32 forward
# the engine vs its own recompute: q4's kernels (int4 and bf16 GEMMs) and the cpu attention backend
# give a row the same bits for any batch, so exactly; fp32 BLAS rounds by row count
OWN_TOL = {"q4": 0.0}
OWN_TOL_OTHER = 1e-4
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}},
    "required": ["city"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def hf_model(smollm_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(smollm_dir), dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def fp32_engine(smollm_dir):
    """An engine pinned to fp32, the format transformers' forward is a reference for."""
    from runtime.engine.engine import Engine

    engine = Engine(weights="fp32", kv_pool_tokens=2048, debug_invariants=True).start()
    yield engine
    engine.shutdown()


def hf_logits(hf_model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf_model(torch.tensor([ids])).logits[0].float().clone()


def own_logits(engine, ids: list[int]) -> torch.Tensor:
    """The engine's model on `ids` in one prefill pass over a fresh pool, on the engine's thread."""

    def run():
        mc, n = engine.model_config, len(ids)
        kv = KVPool(mc.num_layers, n + 1, mc.num_kv_heads, mc.head_dim, engine.dtype, engine.device)
        slots = kv.allocator.alloc(n)
        batch = ForwardBatch(torch.tensor(ids), torch.arange(n), slots, [n], [n], [slots], torch.arange(n))
        return engine.runner.model.forward(batch, kv, engine.runner.attn).float()  # the engine's own backend

    return engine.call(run).result(timeout=300)


def reference_logprobs(logits: torch.Tensor, prompt: list[int], output: list[int], constraint=None) -> torch.Tensor:
    """[len(output), V]: log-softmax of the masked logits at each output position, from `logits`
    [len(prompt + output), V] of the whole sequence."""
    logits = logits[len(prompt) - 1 : len(prompt) + len(output) - 1].clone()
    if constraint is not None:
        matcher = constraint.new_matcher()
        mask = torch.full((len(output), (logits.shape[-1] + 31) // 32), -1, dtype=torch.int32)
        for i, tok in enumerate(output):
            matcher.fill_bitmask(mask, i)
            assert matcher.accept(tok)
        apply_token_bitmask(logits, mask)
    return torch.log_softmax(logits, dim=-1)


def references(engine, hf_model, prompt, output, constraint=None) -> list[tuple[torch.Tensor, float]]:
    """(reference, tolerance): the recompute always, transformers where the engine runs fp32."""
    ids = prompt + output
    exact = engine.runner.attn.batch_invariant and engine.info.weights in OWN_TOL
    tol = OWN_TOL[engine.info.weights] if exact else OWN_TOL_OTHER
    refs = [(reference_logprobs(own_logits(engine, ids), prompt, output, constraint), tol)]
    if engine.info.weights == "fp32":
        refs.append((reference_logprobs(hf_logits(hf_model, ids), prompt, output, constraint), TOL))
    return refs


def check_against_reference(
    result, ref: torch.Tensor, top_count: int, forced_allowed: bool = False, tol: float = TOL
) -> int:
    """Every record equals the reference at its position; returns how many were forced."""
    records = result.logprobs
    assert records is not None and len(records) >= len(result.token_ids) - 1  # the EOS has no record
    forced = 0
    for i, rec in enumerate(records):
        assert rec.token_id == result.token_ids[i]
        if rec.forced:
            assert forced_allowed and rec.logprob == 0.0
            forced += 1
            continue
        assert math.isclose(rec.logprob, ref[i, rec.token_id].item(), abs_tol=tol), (
            i,
            rec,
            ref[i, rec.token_id].item(),
        )
        assert len(rec.top) == min(top_count, int(torch.isfinite(ref[i]).sum()))
        for tok, value in rec.top:  # never a masked-out token; values of the same distribution
            assert math.isfinite(ref[i, tok].item())
            assert math.isclose(value, ref[i, tok].item(), abs_tol=tol)
        assert [v for _, v in rec.top] == sorted((v for _, v in rec.top), reverse=True)
    return forced


def test_greedy_free_text_logprobs_equal_the_models(engine_idle_check, tokenizer, hf_model):
    ids = chat_ids(tokenizer, "What is the capital of France?")
    result = engine_idle_check.generate(
        ids, SamplingParams(max_new_tokens=8, temperature=0.0, logprobs=5, ignore_eos=True)
    )
    assert len(result.logprobs) == len(result.token_ids) == 8
    for ref, tol in references(engine_idle_check, hf_model, ids, result.token_ids):
        check_against_reference(result, ref, 5, tol=tol)
    # greedy: the chosen token is the most likely one
    assert all(rec.top[0][0] == rec.token_id for rec in result.logprobs)


def test_fp32_logprobs_equal_transformers(fp32_engine, tokenizer, hf_model):
    """Whatever format the shared engine runs: fp32 against the independent implementation (and
    its own recompute)."""
    ids = chat_ids(tokenizer, "What is the capital of France?")
    result = fp32_engine.generate(ids, SamplingParams(max_new_tokens=8, temperature=0.0, logprobs=5, ignore_eos=True))
    assert fp32_engine.info.weights == "fp32"
    refs = references(fp32_engine, hf_model, ids, result.token_ids)
    assert len(refs) == 2
    for ref, tol in refs:
        check_against_reference(result, ref, 5, tol=tol)


def test_no_logprobs_unless_asked(engine_idle_check, tokenizer):
    result = engine_idle_check.generate(
        chat_ids(tokenizer, "Name a fruit."), SamplingParams(max_new_tokens=3, temperature=0.0)
    )
    assert result.logprobs is None


def test_sampled_logprobs_are_before_temperature(engine_idle_check, tokenizer, hf_model):
    ids = chat_ids(tokenizer, "Invent a name for a cat.")
    sampling = SamplingParams(max_new_tokens=6, temperature=1.5, top_k=40, seed=3, logprobs=2, ignore_eos=True)
    result = engine_idle_check.generate(ids, sampling)
    for ref, tol in references(engine_idle_check, hf_model, ids, result.token_ids):
        check_against_reference(result, ref, 2, tol=tol)


@pytest.mark.parametrize("mode", ["verify", "direct"])
def test_constrained_logprobs_use_the_masked_distribution(real_engine, service, tokenizer, hf_model, mode):
    """Greedy, batched with a free-text request, under a JSON schema: each record is the masked
    log-softmax; verify mode reports jump-forward tokens' verified values, direct mode marks them."""
    handle = service.compile(GrammarSpec.json_schema(SCHEMA))
    ids = chat_ids(tokenizer, "Which city is the Eiffel tower in? Reply in JSON.")
    specs = [
        GenerateRequest(
            ids, SamplingParams(max_new_tokens=24, temperature=0.0, logprobs=3), constraint=handle, jump_forward=mode
        ),
        GenerateRequest(chat_ids(tokenizer, "Say hi."), SamplingParams(max_new_tokens=4, temperature=0.0)),
    ]
    constrained, free = real_engine.generate_many(specs, timeout=300)
    assert free.logprobs is None
    assert constrained.text.startswith("{")
    for ref, tol in references(real_engine, hf_model, ids, constrained.token_ids, handle):
        forced = check_against_reference(constrained, ref, 3, forced_allowed=mode == "direct", tol=tol)
    if mode == "direct":
        assert forced > 0  # `{"city": "` is forced by the schema
        assert all(r.top == ((r.token_id, 0.0),) for r in constrained.logprobs if r.forced)
    else:
        # forced tokens were verified by the model: the grammar allowed only them, so 0.0 exactly
        assert any(r.logprob == 0.0 and len(r.top) == 1 for r in constrained.logprobs)
