"""Prefix cache in the engine: outputs identical with the cache on and off under every policy, with
a pool small enough to force eviction and retraction; cached_tokens reported; namespaces isolated."""

from __future__ import annotations

import pytest

from runtime.api import GenerateRequest
from runtime.decode.sampling import SamplingParams
from runtime.engine.engine import Engine
from runtime.engine.policies import POLICIES
from tests.conftest import chat_ids

SYSTEM = "You are a helpful assistant for a travel agency. " * 6


def _workload(tokenizer):
    qs = [
        "Plan a trip to Rome.",
        "Best time to visit Oslo?",
        "Cheap flights to Lima?",
        "Pack for a ski trip.",
        "Visa rules for Japan?",
        "Museums in Paris?",
        "Food in Bangkok?",
        "Beaches near Lisbon?",
    ]
    return [chat_ids(tokenizer, q, system=SYSTEM) for q in qs]


def _run(model_dir, prompts, **cfg):
    with Engine(model=str(model_dir), debug_invariants=True, **cfg) as e:
        reqs = [
            GenerateRequest(p, SamplingParams(max_new_tokens=40, temperature=0.0, ignore_eos=True)) for p in prompts
        ]
        out = e.generate_many(reqs, timeout=300)
        stats = e.stats()
        e.check_invariant()
    return [r.token_ids for r in out], stats


@pytest.fixture(scope="module")
def reference(tiny_model_dir, tokenizer):
    prompts = _workload(tokenizer)
    ids, _ = _run(tiny_model_dir, prompts, radix_cache=False, kv_pool_tokens=8192)
    return prompts, ids


@pytest.mark.parametrize("policy", POLICIES)
def test_cache_on_equals_off_with_eviction_and_retraction(tiny_model_dir, reference, policy):
    prompts, expected = reference
    longest = max(len(p) for p in prompts) + 40
    # Room for about three requests at once: forces eviction of cached prefixes and retraction.
    ids, stats = _run(
        tiny_model_dir,
        prompts,
        radix_cache=True,
        schedule_policy=policy,
        kv_pool_tokens=3 * longest,
        chunked_prefill_tokens=64,
    )
    assert ids == expected
    assert stats.cached_prompt_tokens > 0
    assert stats.evicted_tokens > 0 or stats.retractions > 0
    assert stats.kv_slots_request_only == 0


def test_retraction_happens_and_outputs_hold(tiny_model_dir, reference):
    prompts, expected = reference
    longest = max(len(p) for p in prompts) + 40
    ids, stats = _run(tiny_model_dir, prompts, radix_cache=True, kv_pool_tokens=longest + 60)
    assert ids == expected
    assert stats.retractions > 0


def test_page_size_4_equals_cache_off(tiny_model_dir, reference):
    prompts, expected = reference
    ids, stats = _run(tiny_model_dir, prompts, radix_cache=True, page_size=4, kv_pool_tokens=8192)
    assert ids == expected and stats.cached_prompt_tokens > 0


def test_shared_prefix_is_prefilled_once(tiny_model_dir, tokenizer):
    """Requests sharing a long system prompt, arriving together: only one computes it."""
    prompts = _workload(tokenizer)
    with Engine(model=str(tiny_model_dir), kv_pool_tokens=8192, debug_invariants=True) as e:
        out = e.generate_many([GenerateRequest(p, SamplingParams(max_new_tokens=4, temperature=0.0)) for p in prompts])
        stats = e.stats()
    shared = len(chat_ids(tokenizer, "", system=SYSTEM)) - 8
    assert all(r.cached_tokens >= shared for r in out[1:]) or sum(r.cached_tokens for r in out) >= shared * (
        len(prompts) - 1
    )
    assert stats.cached_prompt_tokens >= shared * (len(prompts) - 1)


def test_namespaces_never_share_prefixes(tiny_model_dir, tokenizer):
    p = chat_ids(tokenizer, "same prompt", system=SYSTEM)
    with Engine(model=str(tiny_model_dir), kv_pool_tokens=8192, debug_invariants=True) as e:
        sp = SamplingParams(max_new_tokens=4, temperature=0.0)
        a = e.generate_many([GenerateRequest(p, sp, namespace="tenant-a")])[0]
        b = e.generate_many([GenerateRequest(p, sp, namespace="tenant-b")])[0]
        a2 = e.generate_many([GenerateRequest(p, sp, namespace="tenant-a")])[0]
        assert e.explain_prefix(p, "tenant-b").cached_tokens > 0
        assert e.explain_prefix(p, "tenant-c").cached_tokens == 0
    assert a.cached_tokens == 0 and b.cached_tokens == 0
    assert a2.cached_tokens == len(p) - 1
    assert a.token_ids == b.token_ids == a2.token_ids


def test_n_samples_share_the_prompt(tiny_model_dir, tokenizer):
    p = chat_ids(tokenizer, "sample me", system=SYSTEM)
    with Engine(model=str(tiny_model_dir), kv_pool_tokens=8192, debug_invariants=True) as e:
        reqs = [GenerateRequest(p, SamplingParams(max_new_tokens=8, temperature=1.0, seed=i)) for i in range(8)]
        out = e.generate_many(reqs)
    assert sum(r.cached_tokens for r in out) >= 7 * (len(p) - 1) - 64
