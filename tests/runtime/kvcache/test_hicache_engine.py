"""Hierarchical KV cache in the engine (the tiny random Llama, real files in tmp_path): outputs equal the
cache-off outputs, restarts reuse the disk tier, corrupt/torn pages and a full disk are misses (never
crashes), pinned prefixes stay in L1; and the gateway's pin-on-upload hook."""

from __future__ import annotations

import errno
import logging

import pytest
import torch

from runtime.api import EngineError, GenerateRequest
from runtime.decode.sampling import SamplingParams
from runtime.engine.engine import Engine
from runtime.kvcache.tiers.disk_store import DiskStore
from tests.conftest import chat_ids

# ------------------------------------------------------------------------------ the engine

SYSTEM = "You are a helpful assistant for a travel agency. " * 6
QUESTIONS = [
    "Plan a trip to Rome.",
    "Best time to visit Oslo?",
    "Cheap flights to Lima?",
    "Pack for a ski trip.",
    "Visa rules for Japan?",
    "Museums in Paris?",
]


def _prompts(tokenizer):
    # distinct system prompts, so the working set is several times the device pool
    return [chat_ids(tokenizer, q, system=f"Agent {i}. " + SYSTEM) for i, q in enumerate(QUESTIONS)]


def _greedy(n=12):
    return SamplingParams(max_new_tokens=n, temperature=0.0, ignore_eos=True)


def _serve(engine: Engine, prompts, rounds=1):
    """Requests one at a time, `rounds` passes over the prompts: (token ids, cached tokens) each."""
    out = []
    for _ in range(rounds):
        for p in prompts:
            r = engine.generate_many([GenerateRequest(p, _greedy())], timeout=300)[0]
            out.append((r.token_ids, r.cached_tokens))
            engine.check_invariant()
    return out


@pytest.fixture(scope="module")
def expected(tiny_model_dir, tokenizer):
    prompts = _prompts(tokenizer)
    with Engine(model=str(tiny_model_dir), radix_cache=False, kv_pool_tokens=4096) as e:
        return prompts, [ids for ids, _ in _serve(e, prompts)]


def tiered(model_dir, tmp_path, **cfg) -> Engine:
    longest = 200
    base = dict(
        model=str(model_dir),
        kv_pool_tokens=2 * longest,
        host_pool_tokens=8 * longest,
        disk_cache_dir=str(tmp_path / "kvcache"),
        hicache_page_tokens=16,
        hicache_min_load_tokens=16,
        debug_invariants=True,
    )
    base.update(cfg)
    return Engine(**base)


@pytest.mark.parametrize("policy", ["write_through", "write_through_selective", "write_back"])
def test_tiers_give_the_cache_off_outputs(tiny_model_dir, tmp_path, expected, policy):
    prompts, want = expected
    with tiered(tiny_model_dir, tmp_path, hicache_write_policy=policy) as e:
        got = _serve(e, prompts, rounds=2)
        stats = e.stats()
    assert [ids for ids, _ in got] == want * 2
    second = [cached for _, cached in got[len(prompts) :]]
    assert all(c > 0 for c in second), second  # every revisit hits a lower tier
    assert stats.tier_counters["hicache_demoted_tokens"] > 0 and stats.tier_counters["hicache_loaded_host_tokens"] > 0
    assert stats.kv_slots_request_only == 0


def test_batched_requests_with_eviction_and_retraction(tiny_model_dir, tmp_path, tokenizer, expected):
    prompts, want = expected
    with tiered(tiny_model_dir, tmp_path, kv_pool_tokens=300, host_pool_tokens=600) as e:
        first = e.generate_many([GenerateRequest(p, _greedy()) for p in prompts], timeout=300)
        again = e.generate_many([GenerateRequest(p, _greedy()) for p in prompts], timeout=300)
        e.check_invariant()
    assert [r.token_ids for r in first] == want and [r.token_ids for r in again] == want
    assert sum(r.cached_tokens for r in again) > 0


def test_restart_reuses_the_disk_tier(tiny_model_dir, tmp_path, expected):
    prompts, want = expected
    with tiered(tiny_model_dir, tmp_path, hicache_write_policy="write_back") as e:
        _serve(e, prompts[:2])
    with tiered(tiny_model_dir, tmp_path) as e:  # a new process: empty L1/L2, same folder
        info = e.explain_prefix(prompts[0])
        got = _serve(e, prompts[:2])
        stats = e.stats()
    assert info.by_tier["disk"] > 0 and info.cached_tokens == info.by_tier["disk"]
    assert [ids for ids, _ in got] == want[:2]
    assert all(cached > 0 for _, cached in got)
    assert stats.tier_counters["hicache_loaded_disk_tokens"] > 0
    assert stats.tier_counters["hicache_prefetched_pages"] > 0  # read ahead when the request was queued


def test_another_weight_format_never_reads_the_pages(tiny_model_dir, tmp_path, expected):
    """The pages' identity includes the weight format and the attention arithmetic: a bf16 engine
    does not read an fp32 engine's KV (it would answer with fp32's prefix bits, not its own)."""
    from runtime.kvcache.tiers.disk_store import model_identity

    prompts, want = expected
    with tiered(tiny_model_dir, tmp_path, weights="fp32", hicache_write_policy="write_back") as e:
        _serve(e, prompts[:2])
    with tiered(tiny_model_dir, tmp_path, weights="bf16") as e:
        assert e.explain_prefix(prompts[0]).by_tier["disk"] == 0
        bf16_stats = e.stats()
    assert bf16_stats.tier_counters["hicache_loaded_disk_tokens"] == 0
    with tiered(tiny_model_dir, tmp_path, weights="fp32") as e:  # its own pages are still there
        assert e.explain_prefix(prompts[0]).by_tier["disk"] > 0
        assert [ids for ids, _ in _serve(e, prompts[:2])] == want[:2]
    ids = {model_identity(tiny_model_dir, torch.float32, 2, 2, 16, n) for n in ("", "q4 cpu", "q4 cpu-amx", "fp32 cpu")}
    assert len(ids) == 4


def test_corrupt_pages_after_restart_are_recomputed(tiny_model_dir, tmp_path, expected, caplog):
    prompts, want = expected
    with tiered(tiny_model_dir, tmp_path) as e:
        _serve(e, prompts[:1])
    files = sorted((tmp_path / "kvcache").rglob("*.kv"))
    assert files
    for f in files:  # flip a byte in every page
        raw = bytearray(f.read_bytes())
        raw[100] ^= 0x5A
        f.write_bytes(bytes(raw))
    with caplog.at_level(logging.WARNING, logger="jumpgate.hicache"):
        with tiered(tiny_model_dir, tmp_path) as e:
            got = _serve(e, prompts[:1])
    assert got[0] == (want[0], 0)
    assert any("corrupt" in r.message for r in caplog.records)


def test_disk_full_still_serves(tiny_model_dir, tmp_path, expected, monkeypatch, caplog):
    prompts, want = expected

    def full(self, h, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(DiskStore, "write_page_file", full)
    with caplog.at_level(logging.WARNING, logger="jumpgate.hicache"):
        with tiered(tiny_model_dir, tmp_path, host_pool_tokens=300) as e:
            got = _serve(e, prompts, rounds=2)
            stats = e.stats()
    assert [ids for ids, _ in got] == want * 2
    assert stats.tier_counters["disk_write_errors"] > 0 and stats.tier_counters["disk_pages"] == 0
    assert any("No space left" in r.message for r in caplog.records)


def test_pinned_prefix_stays_resident_and_budget_is_enforced(tiny_model_dir, tmp_path, tokenizer, expected):
    prompts, want = expected
    prefix = chat_ids(tokenizer, "", system="Pinned agent. " + SYSTEM)[:-8]
    with tiered(tiny_model_dir, tmp_path, pin_budget_tokens=len(prefix) + 10) as e:
        pinned = e.pin_prefix(prefix, name="schema:a")
        assert 0 < pinned <= len(prefix) and pinned > len(prefix) - 16
        assert e.pin_prefix(prefix, name="schema:a") == pinned  # idempotent
        _serve(e, prompts, rounds=2)  # eviction pressure: the pool holds about two prompts
        assert e.explain_prefix(prefix).by_tier["device"] == pinned
        with pytest.raises(EngineError) as err:
            e.pin_prefix(prompts[0], name="schema:b")
        assert err.value.code == "pin_budget_exceeded" and "pin budget" in err.value.message
        assert e.unpin_prefix(name="schema:a") == pinned
        assert e.pin_prefix(prompts[0][:64], name="schema:b") == 64  # room again
        e.check_invariant()


def test_pinning_works_without_tiers_and_is_off_by_default(tiny_model_dir, tokenizer):
    prefix = chat_ids(tokenizer, "", system=SYSTEM)
    with Engine(model=str(tiny_model_dir), kv_pool_tokens=1024) as e:
        with pytest.raises(EngineError, match="pinning is off"):
            e.pin_prefix(prefix)
    with Engine(model=str(tiny_model_dir), kv_pool_tokens=1024, pin_budget_tokens=500) as e:
        assert e.pin_prefix(prefix) == len(prefix)
        assert e.stats().kv_slots_evictable == 0
        assert e.unpin_prefix(prefix) == len(prefix)


def test_tiers_off_by_default(tiny_model_dir):
    with Engine(model=str(tiny_model_dir), kv_pool_tokens=256) as e:
        assert type(e.cache.prefix_cache).__name__ == "RadixCache"
        assert "host_slots_total" not in e.stats().tier_counters
    with pytest.raises(ValueError, match="host_pool_tokens"):
        Engine(model=str(tiny_model_dir), kv_pool_tokens=256, disk_cache_dir="/tmp/x")


# ------------------------------------------------------------------------------ the gateway hook

POINT = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}


def test_schema_prefix_is_a_prefix_of_every_request_using_it(tokenizer):
    from gateway.pipeline.prompt import PromptRenderer, schema_instructions
    from gateway.protocol import SystemMessage, UserMessage
    from gateway.registry.pinning import schema_prefix_ids

    renderer = PromptRenderer(tokenizer)
    for system in ("You are a geometry bot.", None):
        ids = schema_prefix_ids(renderer, "json_schema", POINT, system)
        head = [SystemMessage(content=system)] if system else []
        for user in ("Give me a point.", "x?"):
            req = renderer.render_chat(
                [*head, UserMessage(content=user)], None, schema_instructions("json_schema", POINT)
            ).token_ids
            assert req[: len(ids)] == ids
        text = renderer.decode(ids)
        assert "conforms to this JSON schema" in text and "user" not in text.rsplit("<|im_end|>", 1)[-1]


def test_pin_on_upload_and_unpin_on_delete(gateway_client, fake_engine):
    pins = {}
    budget = {"tokens": 1000}

    def pin_prefix(ids, namespace="", name=None):
        if len(ids) > budget["tokens"]:
            raise EngineError("pinning would exceed the pin budget", code="pin_budget_exceeded", param="pin")
        pins[(namespace, name)] = len(ids)
        return len(ids) - 3

    fake_engine.pin_prefix = pin_prefix
    fake_engine.unpin_prefix = lambda namespace="", name=None: pins.pop((namespace, name), 0)
    client = gateway_client()
    resp = client.post("/v1/schemas", json={"schema": POINT, "pin": True, "system_prompt": "Be terse."})
    assert resp.status_code == 201, resp.text
    entry = resp.json()
    assert entry["pinned_tokens"] > 0 and list(pins) == [("", f"schema:{entry['id']}")]
    assert client.delete(f"/v1/schemas/{entry['id']}").status_code == 200
    assert pins == {}

    budget["tokens"] = 5  # the engine's pin budget is used up (a long schema text is compacted, so shrink the budget)
    refused = client.post("/v1/schemas", json={"schema": POINT, "pin": True})
    assert refused.status_code == 400
    err = refused.json()["error"]
    assert err["code"] == "pin_budget_exceeded" and "pin budget" in err["message"] and err["param"] == "pin"
    assert client.get("/v1/schemas").json()["data"] == []  # a refused pin registers nothing


def test_pin_refused_when_the_engine_cannot_pin(gateway_client):
    resp = gateway_client().post("/v1/schemas", json={"schema": POINT, "pin": True})
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "pinning_unavailable"
