"""`python -m bench engine`: prefill and decode speed of our runtime vs transformers' generate."""

from __future__ import annotations

import time

import torch

from bench.common import emit, run_timed
from runtime.api import GenerateRequest
from runtime.engine import Engine
from runtime.sampling import SamplingParams

TOPICS = ["rivers", "volcanoes", "bridges", "owls", "comets", "glaciers", "deserts", "coral reefs",
          "lighthouses", "tides", "forests", "storms", "caves", "islands", "canyons", "auroras"]


def _prompt(tok, topic: str) -> list[int]:
    msgs = [{"role": "user", "content": f"Write a detailed essay about {topic}."}]
    out = tok.apply_chat_template(msgs, add_generation_prompt=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def _decode_rate(lines) -> float:
    """Tokens per second across the batch after every stream got its first token (all prompts fit
    one prefill pass, so the streams decode side by side from then on)."""
    window = max(l.finished for l in lines) - max(l.first_token for l in lines)
    tokens = sum(l.last.completion_tokens - 1 for l in lines)
    return tokens / window


def run(quick: bool = False, argv=None) -> None:
    new_tokens = 32 if quick else 64
    engine = Engine(kv_pool_tokens=16384, radix_cache=False).start()
    tok = engine.tokenizer
    greedy = SamplingParams(max_new_tokens=new_tokens, temperature=0.0, ignore_eos=True)

    # prefill: one ~1k-token prompt, cache off, first token only
    long_ids = tok.encode("The quick brown fox jumps over the lazy dog. " * 100, add_special_tokens=False)[:1024]
    run_timed(engine, [GenerateRequest(long_ids[:64], SamplingParams(max_new_tokens=1))])  # warm-up
    t0 = time.perf_counter()
    run_timed(engine, [GenerateRequest(long_ids, SamplingParams(max_new_tokens=1, temperature=0.0))])
    prefill_tok_s = len(long_ids) / (time.perf_counter() - t0)

    p1 = _prompt(tok, TOPICS[0])
    b1 = run_timed(engine, [GenerateRequest(p1, greedy)])
    decode_b1 = (new_tokens - 1) / (b1[0].finished - b1[0].first_token)
    b16 = run_timed(engine, [GenerateRequest(_prompt(tok, t), greedy) for t in TOPICS])
    decode_b16 = _decode_rate(b16)
    engine.shutdown()

    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(engine.model_dir), dtype=torch.float32).eval()
    ids = torch.tensor([p1])
    kw = dict(do_sample=False, pad_token_id=tok.eos_token_id)
    hf.generate(ids, max_new_tokens=4, min_new_tokens=4, **kw)  # warm-up
    t0 = time.perf_counter()
    hf.generate(ids, max_new_tokens=1, min_new_tokens=1, **kw)
    t_prefill = time.perf_counter() - t0
    t0 = time.perf_counter()
    hf.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, **kw)
    hf_b1 = (new_tokens - 1) / (time.perf_counter() - t0 - t_prefill)

    emit({
        "bench": "engine", "model": engine.model_name, "threads": torch.get_num_threads(),
        "prefill_tok_s": prefill_tok_s, "decode_tok_s_b1": decode_b1, "decode_tok_s_b16": decode_b16,
        "hf_decode_tok_s_b1": hf_b1, "batch_scaling": decode_b16 / decode_b1, "vs_hf_decode": decode_b1 / hf_b1,
    })
