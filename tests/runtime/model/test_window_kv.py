"""Window layers keep only their window in the KV pool (runtime/kvcache/window_pool.py), exactly: the
tiny Gemma 3 of test_gemma3.py (window 8; window, global, window layers). A long prompt prefilled
in chunks and decoded past the window over a window pool far smaller than the prompt gives the
logits of the plain pool; in the engine, greedy tokens and logprobs equal those with every position
kept, a cached prefix longer than the window is reused by a second request, two requests that do
not fit the window pool together wait for it as for the main pool, and bad settings are refused
in one line."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from runtime.api import GenerateRequest
from runtime.attention import make_attention_backend, triton_interpreter_enabled
from runtime.decode.sampling import SamplingParams
from runtime.engine.engine import Engine
from runtime.engine_config import EngineConfig
from runtime.forward_batch import ForwardBatch
from runtime.kvcache.pool import KVPool
from runtime.kvcache.window_pool import window_batch
from runtime.model.config import ModelLoadError
from runtime.model.decoder import DecoderModel, load_weights
from runtime.model.loader import read_config
from runtime.model.runner import window_kv_slots
from tests.conftest import chat_ids
from tests.runtime.model.test_gemma3 import WINDOW, gemma3_dir  # noqa: F401 - the tiny model's fixture
from tests.runtime.model.test_model_families import PROMPT

CPU = torch.device("cpu")
LONG = " ".join([PROMPT] * 6)  # about 100 tokens of prompt: many windows


def run_chunks(model, cfg, ids: list[int], chunk: int, decode: int, window_slots: int, backend: str):
    """Logits of every row: `ids` prefilled `chunk` tokens a pass, then `decode` greedy steps. With
    `window_slots`, the window layers' slots of positions no later token sees are released after
    every pass (as the cache manager's trim does) and the scratch row they then read is poisoned."""
    kv = KVPool(
        cfg.num_layers, len(ids) + decode + 8, cfg.num_kv_heads, cfg.head_dim,
        layer_windows=cfg.layer_windows, window_slots=window_slots,
    )  # fmt: skip
    attn, wattn = make_attention_backend(backend, CPU), make_attention_backend(backend, CPU)
    rows, ids, done = [], list(ids), 0
    slots = torch.empty(0, dtype=torch.int64)
    n_prompt = len(ids)
    while done < n_prompt + decode:
        hi = min(done + chunk, n_prompt) if done < n_prompt else done + 1
        new = kv.allocator.alloc(hi - done)
        assert new is not None, "the window pool ran out: positions were not released"
        slots = torch.cat([slots, new])
        batch = ForwardBatch(
            torch.tensor(ids[done:hi]), torch.arange(done, hi), new, [hi - done], [hi], [slots], torch.arange(hi - done)
        )
        window = None
        if kv.window is not None:
            window = (window_batch(batch, kv.window), wattn)
        logits = model.forward(batch, kv, attn, window)
        rows.append(logits)
        done = hi
        if done >= n_prompt and len(ids) < n_prompt + decode:
            ids.append(int(logits[-1].argmax()))
        if kv.window is not None:
            kv.window.release(slots[: max(0, done - WINDOW + 1)])
            for li, windowed in enumerate(kv.windowed):
                if windowed:  # whatever a released position reads must be masked out
                    kv.k[li][kv.window.none] = 1e3
                    kv.v[li][kv.window.none] = 1e3
    return torch.cat(rows), kv


def test_a_long_prompt_over_a_small_window_pool_gives_the_same_logits(gemma3_dir, tokenizer):  # noqa: F811
    """The torch backend's window plan (the cpu kernel's is the engine test's, below)."""
    cfg = read_config(gemma3_dir)
    model = DecoderModel(cfg, load_weights(gemma3_dir), CPU, torch.float32)
    ids = chat_ids(tokenizer, LONG)
    assert len(ids) > 10 * WINDOW
    chunk, window_slots = 32, WINDOW + 32
    full, plain = run_chunks(model, cfg, ids, chunk, 2 * WINDOW, 0, "torch")
    trimmed, kv = run_chunks(model, cfg, ids, chunk, 2 * WINDOW, window_slots, "torch")
    torch.testing.assert_close(trimmed, full, atol=1e-5, rtol=1e-5)
    # the window layers' K/V are bounded by the window pool (40 slots), not the context (133)
    windowed = [li for li, w in enumerate(cfg.layer_windows) if w]
    assert kv.windowed == [True, False, True] and plain.window is None
    assert all(kv.k[li].shape[0] == window_slots + 1 for li in windowed)
    assert all(plain.k[li].shape[0] == len(ids) + 2 * WINDOW + 9 for li in windowed)
    assert kv.kv_bytes()["window"] * 3 < plain.kv_bytes()["full"] * len(windowed) / cfg.num_layers


@pytest.mark.slow
def test_the_triton_backend_reads_the_window_pool_exactly(gemma3_dir, tokenizer):  # noqa: F811
    """The Triton kernels over the translated window slots (the interpreter on CPU): the same logits
    as with every position kept, and as the torch backend's."""
    if not torch.cuda.is_available() and not triton_interpreter_enabled():
        pytest.skip("no GPU and TRITON_INTERPRET is off: Triton kernels cannot run here")
    cfg = read_config(gemma3_dir)
    model = DecoderModel(cfg, load_weights(gemma3_dir), CPU, torch.float32)
    ids = chat_ids(tokenizer, LONG)
    full, _ = run_chunks(model, cfg, ids, 32, 2 * WINDOW, 0, "triton")
    trimmed, kv = run_chunks(model, cfg, ids, 32, 2 * WINDOW, WINDOW + 32, "triton")
    ref, _ = run_chunks(model, cfg, ids, 32, 2 * WINDOW, 0, "torch")
    assert kv.window is not None
    torch.testing.assert_close(trimmed, full, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(trimmed, ref, atol=1e-4, rtol=1e-4)


def greedy(n: int) -> SamplingParams:
    return SamplingParams(max_new_tokens=n, temperature=0.0, ignore_eos=True, logprobs=0)


def serve_two_turns(engine: Engine, tokenizer) -> list:
    """A long prompt, then a second turn whose prompt is the first with its answer and more (a
    cached prefix many windows long), then two requests at once; the invariants after each."""
    first = chat_ids(tokenizer, LONG + " " + LONG)
    out = engine.generate_many([GenerateRequest(first, greedy(3 * WINDOW))], timeout=300)
    engine.check_invariant()
    second = first + out[0].token_ids + chat_ids(tokenizer, "And once more, shorter.")
    out += engine.generate_many([GenerateRequest(second, greedy(WINDOW))], timeout=300)
    engine.check_invariant()
    both = [chat_ids(tokenizer, LONG + " Two."), chat_ids(tokenizer, LONG + " Three.")]
    out += engine.generate_many([GenerateRequest(p, greedy(2 * WINDOW)) for p in both], timeout=300)
    engine.check_invariant()
    return out


def test_the_engine_answers_the_same_with_only_the_window_kept(gemma3_dir, tokenizer):  # noqa: F811
    small = dict(chunked_prefill_tokens=32, max_jump_forward_tokens=8, speculative_tokens=4, kv_pool_tokens=2048)
    with Engine(model=str(gemma3_dir), window_kv_tokens=0, debug_invariants=True, **small) as e:
        assert e.stats().kv_window_slots_total == 0
        expected = serve_two_turns(e, tokenizer)
    # one request's need (window 8 + 96 + one 32-token pass): the two at once wait for each other
    size = WINDOW + 96 + 32
    with Engine(model=str(gemma3_dir), window_kv_tokens=size, debug_invariants=True, **small) as e:
        got = serve_two_turns(e, tokenizer)
        stats = e.stats()
    assert stats.kv_window_slots_total == size and expected[0].prompt_tokens > size
    for a, b in zip(got, expected):
        assert a.token_ids == b.token_ids
        torch.testing.assert_close(
            torch.tensor([t.logprob for t in a.logprobs]),
            torch.tensor([t.logprob for t in b.logprobs]),
            atol=1e-5,
            rtol=1e-5,
        )
    assert got[1].cached_tokens > 10 * WINDOW  # the second turn reused the first's KV
    assert got[1].cached_tokens == expected[1].cached_tokens


def test_window_pool_settings_are_checked_in_one_line(gemma3_dir):  # noqa: F811
    mc = read_config(gemma3_dir)
    assert window_kv_slots(EngineConfig(), mc, 4096) == 1024  # a quarter of the pool
    assert window_kv_slots(EngineConfig(), mc, 600) == 0  # one request's need is the whole pool: off
    assert window_kv_slots(EngineConfig(window_kv_tokens=0), mc, 4096) == 0
    every_layer = dataclasses.replace(mc, layer_windows=(WINDOW,) * mc.num_layers)  # as Phi-3, Mistral v0.1
    assert window_kv_slots(EngineConfig(), every_layer, 4096) == 0  # a quarter would hold 4x less context
    assert window_kv_slots(EngineConfig(window_kv_tokens=1024), every_layer, 4096) == 1024  # asked: on
    assert window_kv_slots(EngineConfig(tensor_parallel_size=2), mc, 4096) == 0  # auto: off where unsupported
    with pytest.raises(ModelLoadError, match="one request needs 616 window slots"):
        window_kv_slots(EngineConfig(window_kv_tokens=100), mc, 4096)
    with pytest.raises(ModelLoadError, match="does not work with tensor parallelism"):
        window_kv_slots(EngineConfig(window_kv_tokens=800, tensor_parallel_size=2), mc, 4096)
    with pytest.raises(ModelLoadError, match="does not work with the host and disk KV tiers"):
        window_kv_slots(EngineConfig(window_kv_tokens=800, host_pool_tokens=64), mc, 4096)
    with pytest.raises(ModelLoadError, match="window-kv-tokens 100"):
        Engine(model=str(gemma3_dir), window_kv_tokens=100, kv_pool_tokens=512)
