"""`python -m bench.probes.window_kv_bytes`: KV bytes per token of context for a tiny Gemma 3 at 4k.

A tiny random Gemma 3 built by transformers' classes (6 layers: 5 sliding-window layers of window 512
and one global layer, as Gemma 3's 5:1 pattern; the SmolLM2 tokenizer), served by the engine with
every position kept in every layer (`--window-kv-tokens 0`, before) and with the window layers'
own pool (the default, after, runtime/kvcache/window_pool.py). One request: a 4,096-token prompt
and 8 greedy tokens. Prints one JSON line per mode: the K/V bytes the finished request's context
holds (full slots x the full layers' bytes a slot, plus window slots x the window layers'), per
token of context; the pools' allocated bytes per slot of the full pool; and the output tokens
(equal in both modes)."""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import torch

from runtime.api import GenerateRequest
from runtime.decode.sampling import SamplingParams
from runtime.engine.engine import Engine
from runtime.model.loader import resolve_model_dir
from tests.runtime.model.test_gemma3 import GEMMA3
from tests.runtime.model.test_model_families import save_tiny

CONTEXT = 4096
WINDOW = 512
POOL = 8192


def build(out: Path) -> Path:
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    config = dict(GEMMA3, num_hidden_layers=6, sliding_window=WINDOW, max_position_embeddings=2 * POOL)
    config["layer_types"] = ["sliding_attention"] * 5 + ["full_attention"]
    return save_tiny(out, resolve_model_dir(), Gemma3TextConfig, Gemma3ForCausalLM, **config)


def measure(model_dir: Path, window_kv_tokens: int | None) -> dict:
    prompt = torch.randint(100, 40000, (CONTEXT,), generator=torch.Generator().manual_seed(0)).tolist()
    params = SamplingParams(max_new_tokens=8, temperature=0.0, ignore_eos=True)
    with Engine(model=str(model_dir), kv_pool_tokens=POOL, window_kv_tokens=window_kv_tokens, weights="fp32") as engine:
        start = time.perf_counter()
        out = engine.generate_many([GenerateRequest(prompt, params)], timeout=600)[0]
        seconds = time.perf_counter() - start
        stats = engine.stats()
        kv = engine.runner.kv
        pool = kv.kv_bytes()
        full_rows = kv.num_slots + 1
        full_slot_bytes = pool["full"] // full_rows  # all layers' bytes a slot where there is no window pool
        held_full = stats.kv_slots_total - stats.kv_slots_free
        if kv.window is None:
            held_bytes = held_full * full_slot_bytes
            held_window = 0
        else:
            window_rows = kv.window.num_slots + 1
            held_window = stats.kv_window_slots_total - stats.kv_window_slots_free
            held_bytes = held_full * full_slot_bytes + held_window * (pool["window"] // window_rows)
    return {
        "probe": "window_kv_bytes",
        "mode": "every position kept" if window_kv_tokens == 0 else "window pool (default)",
        "context_tokens": held_full,
        "window": WINDOW,
        "held_window_slots": held_window,
        "kv_bytes_per_context_token": round(held_bytes / held_full, 1),
        "pool_bytes": pool["full"] + pool["window"],
        "pool_bytes_per_full_slot": round((pool["full"] + pool["window"]) / kv.num_slots, 1),
        "window_slots": stats.kv_window_slots_total,
        "seconds": round(seconds, 2),
        "output": out.token_ids,
    }


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build(Path(tmp) / "tiny-gemma3")
        rows = [measure(model_dir, 0), measure(model_dir, None)]
    rows[1]["same_output"] = rows[0]["output"] == rows[1]["output"]
    rows[1]["kv_bytes_ratio"] = round(rows[1]["kv_bytes_per_context_token"] / rows[0]["kv_bytes_per_context_token"], 4)
    for row in rows:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
