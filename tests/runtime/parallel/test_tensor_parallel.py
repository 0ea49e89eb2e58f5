"""Tensor parallelism on CPU (gloo), issue #45 item 4: a 2-rank engine gives the same greedy tokens
as one process and logits within 1e-4, holds about half the weights per rank (a budget one process
is refused under serves it), refuses what it cannot split in one line, and leaves no worker behind.

A tiny random Llama (transformers' LlamaConfig, fp32, the SmolLM2 tokenizer) whose vocabulary
(49,155 rows) does not divide by the rank count, so the padded vocabulary shard is exercised too.
"""

from __future__ import annotations

import os
import time

import pytest
import torch

from runtime.api import GenerateRequest
from runtime.decode.sampling import SamplingParams
from runtime.engine.engine import Engine
from runtime.engine_config import EngineConfig
from runtime.forward_batch import ForwardBatch
from runtime.model.config import ModelConfig, ModelLoadError
from runtime.parallel.sharding import check_shardable, shard_weights
from tests.conftest import make_tiny_llama

VOCAB = 49155  # not a multiple of 2 or 4
BUDGET_MB = 8  # one process holds ~12.6 MiB of this model's weights, each of 2 ranks ~6.3 MiB
SETTINGS = dict(
    device="cpu",
    weights="fp32",
    attention_backend="torch",
    kv_pool_tokens=256,
    max_running_requests=4,
    num_threads=1,
    speculative="off",
)


@pytest.fixture(scope="module")
def tp_model(tmp_path_factory, smollm_dir):
    return make_tiny_llama(tmp_path_factory.mktemp("tp-llama"), smollm_dir, vocab_size=VOCAB)


@pytest.fixture(scope="module")
def one_rank(tp_model):
    engine = Engine(model=str(tp_model), **SETTINGS)
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def two_ranks(tp_model):
    """TP=2 under a per-rank budget that one process's weights exceed. At the end its workers must
    leave once rank 0's pipe ends close (a stopped engine: tests/e2e/serving/test_serve_tensor_parallel.py)."""
    engine = Engine(model=str(tp_model), tensor_parallel_size=2, rank_memory_budget_mb=BUDGET_MB, **SETTINGS)
    pids = engine.runner.tp.pids
    yield engine
    for conn in engine.runner.tp.conns:  # what a killed rank 0 leaves its workers: their pipe's end
        conn.close()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(running(pid) for pid in pids):
        time.sleep(0.1)
    assert not [pid for pid in pids if running(pid)], "a tensor-parallel worker outlived rank 0's pipe"
    engine.shutdown()


def running(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie waiting to be reaped is not)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return not any(line.startswith("State:") and "Z" in line.split()[1] for line in f)
    except FileNotFoundError:
        return False


PROMPTS = [[1, 504, 2011, 3000, 77], [1, 9, 8, 7, 6, 5, 4, 3, 2000], [1, 4242]]


def greedy_tokens(engine: Engine) -> list[list[int]]:
    specs = [
        GenerateRequest(prompt_ids=p, sampling=SamplingParams(max_new_tokens=10, temperature=0.0)) for p in PROMPTS
    ]
    results = engine.generate_many(specs, timeout=120)
    assert all(r.finish_reason in ("length", "stop") for r in results), results
    return [r.token_ids for r in results]


def test_two_ranks_give_the_same_greedy_tokens(one_rank, two_ranks):
    assert greedy_tokens(two_ranks) == greedy_tokens(one_rank)
    assert two_ranks.info.weights == "fp32"


def pass_logits(engine: Engine, ids: list[int], start: int, slots: torch.Tensor) -> torch.Tensor:
    """The logits of every new row of a one-request pass (positions start.., over `slots`)."""
    n = len(ids)
    batch = ForwardBatch(
        input_ids=torch.tensor(ids),
        positions=torch.arange(start, start + n),
        out_slots=slots[start : start + n],
        extend_lens=[n],
        seq_lens=[start + n],
        slot_rows=[slots[: start + n]],
        logits_index=torch.arange(n),
    )
    return engine.call(lambda: engine.runner.forward(batch)).result(timeout=60)


def test_two_ranks_logits_within_1e4_for_a_prefill_and_a_decode(one_rank, two_ranks):
    prompt = PROMPTS[0] + PROMPTS[1]
    got = []
    for engine in (one_rank, two_ranks):
        allocator = engine.runner.kv.allocator
        slots = engine.call(lambda a=allocator: a.alloc(len(prompt) + 1)).result(timeout=60)
        try:
            prefill = pass_logits(engine, prompt, 0, slots)
            decode = pass_logits(engine, [int(prefill[-1].argmax())], len(prompt), slots)  # over the cached prompt
        finally:
            engine.call(lambda a=allocator, s=slots: a.free(s)).result(timeout=60)
        got.append((prefill, decode))
    (p1, d1), (p2, d2) = got
    assert p2.shape == p1.shape == (len(prompt), VOCAB)
    assert (p2 - p1).abs().max().item() <= 1e-4
    assert (d2 - d1).abs().max().item() <= 1e-4


def test_a_model_over_one_rank_budget_is_refused_alone_and_served_split(tp_model, two_ranks):
    with pytest.raises(ModelLoadError, match=r"--rank-memory-budget-mb 8: the weights need 1\d\.\d MiB on one process"):
        Engine(model=str(tp_model), rank_memory_budget_mb=BUDGET_MB, **SETTINGS)
    assert two_ranks.generate(PROMPTS[2], SamplingParams(max_new_tokens=4, temperature=0.0)).finish_reason == "length"


def test_each_rank_holds_its_heads_kv_and_half_the_weights(one_rank, two_ranks):
    from runtime.parallel.budget import held_weight_bytes

    assert two_ranks.runner.kv.k[0].shape[-2] == one_rank.runner.kv.k[0].shape[-2] // 2  # KV heads split
    half = held_weight_bytes(two_ranks.runner.model) / held_weight_bytes(one_rank.runner.model)
    assert 0.45 < half < 0.55, half


def test_what_cannot_be_split_is_refused_in_one_line(tp_model):
    with pytest.raises(ModelLoadError, match=r"--tensor-parallel-size 4: the model's 2 KV heads do not split evenly"):
        Engine(model=str(tp_model), tensor_parallel_size=4, **SETTINGS)  # before any worker starts
    with pytest.raises(ValueError, match=r"--tensor-parallel-size: must be 1, 2 or 4, not 3"):
        EngineConfig(tensor_parallel_size=3)
    with pytest.raises(ValueError, match=r"--tensor-parallel-size 2: the host and disk KV tiers"):
        EngineConfig(tensor_parallel_size=2, host_pool_tokens=64)
    cpu, mc = torch.device("cpu"), ModelConfig(64, 64, 128, 2, 4, 2, 16)
    with pytest.raises(ModelLoadError, match=r"--weights q4: not split across ranks"):
        check_shardable(mc, 2, cpu, "q4")
    moe = ModelConfig(64, 64, 128, 2, 4, 2, 16, num_experts=4, experts_per_token=2, model_type="qwen3_moe")
    with pytest.raises(ModelLoadError, match=r"mixture-of-experts models \(qwen3_moe\) are not split"):
        check_shardable(moe, 2, cpu)


def test_shards_put_back_together_are_the_weights():
    mc = ModelConfig(5, 4, 6, 1, 2, 2, 2)
    w = {
        "model.embed_tokens.weight": torch.randn(5, 4),
        "model.layers.0.self_attn.q_proj.weight": torch.randn(4, 4),
        "model.layers.0.self_attn.o_proj.weight": torch.randn(4, 4),
        "model.layers.0.self_attn.o_proj.bias": torch.randn(4),
        "model.layers.0.mlp.down_proj.weight": torch.randn(4, 6),
        "model.layers.0.input_layernorm.weight": torch.randn(4),
    }
    (a, local), (b, _) = shard_weights(w, mc, 0, 2), shard_weights(w, mc, 1, 2)
    assert (local.num_heads, local.num_kv_heads, local.intermediate_size) == (1, 1, 3)
    embed = torch.cat([a["model.embed_tokens.weight"], b["model.embed_tokens.weight"]])
    assert torch.equal(embed[:5], w["model.embed_tokens.weight"]) and not embed[5:].any()  # padded with zeros
    for name, dim in (("self_attn.q_proj", 0), ("self_attn.o_proj", 1), ("mlp.down_proj", 1)):
        key = f"model.layers.0.{name}.weight"
        assert torch.equal(torch.cat([a[key], b[key]], dim=dim), w[key])
    assert "model.layers.0.self_attn.o_proj.bias" in a and "model.layers.0.self_attn.o_proj.bias" not in b
    assert a["model.layers.0.input_layernorm.weight"] is w["model.layers.0.input_layernorm.weight"]


@pytest.mark.skipif(not os.environ.get("JUMPGATE_TP_E2E"), reason="one more worker start (~7 s): JUMPGATE_TP_E2E=1")
def test_no_worker_is_a_child_left_running_after_a_refusal(tp_model):
    """A start that fails after the workers started (here rank 0's budget) leaves none running."""
    before = set(_children())
    with pytest.raises(ModelLoadError, match=r"--rank-memory-budget-mb 1: the weights need"):
        Engine(model=str(tp_model), tensor_parallel_size=2, rank_memory_budget_mb=1, **SETTINGS)
    assert not [pid for pid in set(_children()) - before if running(pid)]


def _children() -> list[int]:
    me = os.getpid()
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == me:
                        out.append(int(entry))
            except (OSError, ValueError, IndexError):
                pass
    return out


def test_a_worker_lost_under_a_request_fails_it_and_stops_the_engine(tp_model):
    """The request in flight ends at once with ENGINE_STOPPED (the gateway's 503), a later one is
    refused, the engine reports itself stopped, and shutting it down leaves no process behind."""
    import queue
    import signal

    from runtime.api import ENGINE_STOPPED, EngineError

    engine = Engine(model=str(tp_model), tensor_parallel_size=2, **SETTINGS).start()
    try:
        events: queue.SimpleQueue = queue.SimpleQueue()
        long = GenerateRequest(prompt_ids=PROMPTS[0], sampling=SamplingParams(max_new_tokens=1500, temperature=0.0))
        engine.enqueue(long, events.put)
        assert not events.get(timeout=60).finished  # decoding
        (pid,) = engine.runner.tp.pids
        os.kill(pid, signal.SIGKILL)
        last = events.get(timeout=60)
        while not last.finished:
            last = events.get(timeout=60)
        assert last.finish_reason == "error"
        assert last.error.startswith(f"{ENGINE_STOPPED}: tensor-parallel rank 1 exited"), last.error
        with pytest.raises(EngineError) as refused:
            engine.enqueue(GenerateRequest(prompt_ids=PROMPTS[2]), events.put)
        assert refused.value.code == "engine_stopped"
        assert not engine.is_running
    finally:
        engine.shutdown()
    assert not running(pid)
