"""`python -m bench engine [--formats fp32,auto,bf16,q8,q4] [--threads N] [--prefill-only 1024,3072]`:
prefill and decode speed of our runtime per weight format, side by side in one run, with fp32 (eager)
as the reference. A format written `auto+tiles` (or `q4+tiles`, ...) runs with `--attention-tiles on`,
`auto+vector` with `--attention-tiles off` (the float32 vector code), `+attn-bf16` / `+attn-float32`
with that `--attention-precision` (`q4+tiles+attn-float32`); a plain format with the engine's defaults.
`q4k`: q4 over the default model rewritten as llama.cpp's Q4_K_M mix (runtime/model/gguf_requantize.py,
made once into the cache folder; SmolLM2's 576-wide rows are not whole 256-weight super-blocks, so as
in llama.cpp most of its matrices fall back to Q5_0 and Q8_0, its 1536-wide ffn_down are Q4_K/Q6_K).
Each line says `linear_bytes`, the bytes of the linear and logits layers' weights a decode step reads.

One JSON line per format: decode tok/s at batch 1/16/64, prefill tok/s at 1k and 3k tokens
(`--prefill-tokens N,...`: other lengths, keyed `prefill_tok_s_256` for 256; CI's smoke run's), the
ratios to fp32 from the same run, and the split of a batch-1 decode step into linear layers,
attention, the model's other ops, and the engine's share (sampling, scheduling, detokenizing).
`forward_b16_*`: one model pass of 16 decoding requests at the decode runs' mean context, with the
profiler's linear and attention shares of it.
The split: the time torch.profiler sees inside the linear and attention ops per pass (five
profiled passes) as shares of the same pass unprofiled (its best of ten), the rest being the other
ops; the shares applied to the model runner's own time per pass in the batch-1 run
(EngineStats.forward_seconds); the engine's share is the rest of the step (sampling, grammar,
scheduling, detokenizing, emitting). (Until stop 40 the shares were of the profiled passes' total,
which counted the profiler's own cost per event as other ops.)
The prefill split (`prefill_split_*`): one 3k-token prefill (1k with --quick) in the engine's chunks,
model passes only, split by the profiler into linear layers and attention; on each line
`prefill_split_ceiling_vs_<reference>` is the reference's prefill over this format's attention alone,
the most the prefill ratio could reach if this format's linear layers took no time.
`--prefill-only N,N,...`: that split alone, at each prompt length, one line per format and length
(`prefill_ms`, `linear_ms`, `attention_ms`, `attention_frac`, and `prefill_ms_vs_<first format>`),
no decode runs: the attention kernel's share of a prefill as prompts grow.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch

from bench.harness.common import emit, run_timed
from runtime.api import GenerateRequest
from runtime.attention import make_attention_backend
from runtime.decode.sampling import SamplingParams
from runtime.engine.engine import Engine
from runtime.forward_batch import ForwardBatch
from runtime.kvcache.pool import KVPool
from runtime.model.decoder import resolve_format
from runtime.model.loader import resolve_model_dir

TOPICS = [
    "rivers",
    "volcanoes",
    "bridges",
    "owls",
    "comets",
    "glaciers",
    "deserts",
    "coral reefs",
    "lighthouses",
    "tides",
    "forests",
    "storms",
    "caves",
    "islands",
    "canyons",
    "auroras",
]
LINEAR_OPS = {
    "aten::linear",
    "aten::_weight_int4pack_mm_for_cpu",
    "aten::_weight_int8pack_mm",
    "jumpgate_cpu::int4_linear",
    "jumpgate_cpu::int8_linear",
    "jumpgate_cpu::int4_linear_f32",
    "jumpgate_cpu::int8_linear_f32",
    "jumpgate_cpu::int4_linear_i8",
}
ATTENTION_OPS = {"aten::scaled_dot_product_attention", "jumpgate_cpu::paged_attention"}


def _q4_k_m_model() -> Path:
    """The default model as a Q4_K_M file, written once into the cache (from its Q4_1 blocks dequantized)."""
    from runtime.model.gguf_requantize import write_q4_k_m
    from runtime.model.loader import cache_root, default_model_path

    src = default_model_path()
    out = cache_root() / "models" / src.name.replace(".Q4_1.gguf", ".Q4_K_M.gguf")
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.{os.getpid()}")
        write_q4_k_m(src, tmp)
        os.replace(tmp, out)
    return out


# formats that run another file of the default model: name -> (weight format, the file)
MODEL_FORMATS = {"q4k": ("q4", _q4_k_m_model)}


def _model_for(fmt: str) -> tuple[str, str | None]:
    """(weight format, model file or None for the default) of a requested format."""
    if fmt not in MODEL_FORMATS:
        return fmt, None
    weights, make = MODEL_FORMATS[fmt]
    return weights, str(make())


def _linear_bytes(model) -> int:
    """Bytes of the linear and logits layers' weights (what a batch-1 decode step streams)."""
    layers = [lin for layer in model.layers for lin in (layer.qkv, layer.o_proj, layer.gate_up, layer.down)]
    return sum(lin.nbytes for lin in layers if lin is not None) + model.lm_head.nbytes


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


def _prefill_rate(engine, ids: list[int]) -> float:
    t0 = time.perf_counter()
    run_timed(engine, [GenerateRequest(ids, SamplingParams(max_new_tokens=1, temperature=0.0))])
    return len(ids) / (time.perf_counter() - t0)


def _profiled_shares(forward, passes: int, seconds: float) -> dict[str, float]:
    """The linear and attention shares of one call of `forward`, which takes `seconds` unprofiled:
    the profiler's time inside those ops per call (`passes` calls: one is at the mercy of a
    scheduler hiccup) over `seconds`. Not over the profiled calls' own total: the profiler's cost
    per event lands outside the kernels (in the ops around them, or the one C++ call that runs
    them all), and would otherwise count as the step's other work."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(passes):
            forward()
    events = prof.key_averages()
    linear = sum(e.cpu_time_total for e in events if e.key in LINEAR_OPS) / passes * 1e-6
    attention = sum(e.cpu_time_total for e in events if e.key in ATTENTION_OPS) / passes * 1e-6
    # a profiled kernel can run a little slower than the unprofiled pass: cap the two at the whole
    scale = max(1.0, (linear + attention) / seconds)
    return {"linear_frac": linear / seconds / scale, "attention_frac": attention / seconds / scale}


def decode_pass(model, cfg, attn, batch_size: int, context: int) -> tuple[ForwardBatch, KVPool]:
    """A pass of `batch_size` requests each decoding one token at `context` tokens (own slots,
    nothing shared, the pool's K/V as it comes: attention's cost does not depend on the values),
    and a pool laid out as the engine keeps it for `attn`."""
    row = context + 1
    kv = KVPool(
        cfg.num_layers,
        batch_size * row + 1,
        cfg.num_kv_heads,
        cfg.head_dim,
        model.dtype,
        model.device,
        head_major=attn.kv_head_major,
    )
    rows = [torch.arange(r * row, (r + 1) * row, device=model.device) for r in range(batch_size)]
    batch = ForwardBatch(
        torch.full((batch_size,), 42),
        torch.full((batch_size,), context),
        torch.stack([r[context] for r in rows]),
        [1] * batch_size,
        [row] * batch_size,
        rows,
        torch.arange(batch_size),
    )
    return batch, kv


def _forward_split(model, cfg, attn, context: int, repeats: int, batch_size: int = 1) -> dict[str, float]:
    """Seconds of one decode pass of `batch_size` requests at `context` tokens each (`decode_pass`)
    through the engine's attention backend, and the profiler's shares of it."""
    batch, kv = decode_pass(model, cfg, attn, batch_size, context)
    model.forward(batch, kv, attn)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        model.forward(batch, kv, attn)
        best = min(best, time.perf_counter() - t0)
    return {"forward_s": best, **_profiled_shares(lambda: model.forward(batch, kv, attn), 5, best)}


def _prefill_split(model, cfg, attn, ids: list[int], chunk: int) -> dict[str, float]:
    """Seconds of one prefill of `ids` in the engine's chunks (model passes only), and the
    profiler's shares of it: what bounds the prefill ratio (attention is the same kernel for every
    weight format, so with linears that took no time the ratio could reach at most the reference's
    prefill over this format's attention)."""
    n = len(ids)
    kv = KVPool(
        cfg.num_layers, n + 1, cfg.num_kv_heads, cfg.head_dim, model.dtype, model.device, head_major=attn.kv_head_major
    )
    slots = torch.arange(n, device=model.device)
    tokens = torch.tensor(ids)

    def prefill():
        for start in range(0, n, chunk):
            end = min(n, start + chunk)
            model.forward(
                ForwardBatch(
                    tokens[start:end],
                    torch.arange(start, end),
                    slots[start:end],
                    [end - start],
                    [end],
                    [slots[:end]],
                    torch.tensor([end - start - 1]),
                ),
                kv,
                attn,
            )

    prefill()  # warm-up
    t0 = time.perf_counter()
    prefill()
    seconds = time.perf_counter() - t0
    return {"prefill_s": seconds, **_profiled_shares(prefill, 1, seconds)}


TILES_SUFFIX = {"tiles": "on", "vector": "off"}  # format suffix -> --attention-tiles
PRECISION_SUFFIX = {"attn-bf16": "bf16", "attn-float32": "float32"}  # -> --attention-precision


def parse_format(requested: str) -> tuple[str, dict[str, str]]:
    """`q4+tiles+attn-bf16` -> ("q4", the Engine settings its suffixes ask for)."""
    fmt, *suffixes = requested.split("+")
    settings = {"attention_tiles": "auto", "attention_precision": "auto"}
    for suffix in suffixes:
        if suffix in TILES_SUFFIX:
            settings["attention_tiles"] = TILES_SUFFIX[suffix]
        elif suffix in PRECISION_SUFFIX:
            settings["attention_precision"] = PRECISION_SUFFIX[suffix]
        else:
            raise ValueError(f"{requested}: a format's suffixes are +tiles, +vector, +attn-bf16 or +attn-float32")
    return fmt, settings


def _engine(fmt: str, threads: int | None, settings: dict[str, str], model: str | None = None) -> Engine:
    return Engine(
        model=model,
        device="cpu",
        kv_pool_tokens=16384,
        radix_cache=False,
        weights=fmt,
        num_threads=threads,
        max_running_requests=64,
        **settings,
    ).start()


def _prefill_only(fmt: str, threads: int | None, settings: dict[str, str], lengths: list[int]) -> list[dict]:
    """The prefill split alone at each prompt length (`--prefill-only`)."""
    weights, model_file = _model_for(fmt)
    engine = _engine(weights, threads, settings, model_file)
    model, tok = engine.runner.model, engine.tokenizer
    text_ids = tok.encode("The quick brown fox jumps over the lazy dog. " * 1000, add_special_tokens=False)
    attn, lines = engine.runner.attn, []
    for n in lengths:
        ids = text_ids[:n]
        pre = engine.call(
            lambda ids=ids: _prefill_split(model, engine.model_config, attn, ids, engine.config.chunked_prefill_tokens)
        ).result()
        lines.append(
            {
                "bench": "engine",
                "kind": "prefill_split",
                "weights": model.weights,
                "attention": engine.info.attention_backend,
                "threads": torch.get_num_threads(),
                "tokens": len(ids),
                "prefill_ms": pre["prefill_s"] * 1e3,
                "linear_ms": pre["prefill_s"] * pre["linear_frac"] * 1e3,
                "attention_ms": pre["prefill_s"] * pre["attention_frac"] * 1e3,
                "attention_frac": pre["attention_frac"],
            }
        )
    engine.shutdown()
    return lines


def _label(n: int) -> str:
    """A prompt length as the keys name it: 1024 -> 1k, 256 -> 256."""
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


def _measure(
    fmt: str,
    quick: bool,
    threads: int | None,
    settings: dict[str, str] | None = None,
    model_file: str | None = None,
    prefill: tuple[int, ...] | None = None,
) -> dict:
    new_tokens = 16 if quick else 64
    prefill = prefill or ((1024,) if quick else (1024, 3072))
    engine = _engine(fmt, threads, settings or {}, model_file)
    model, tok = engine.runner.model, engine.tokenizer
    greedy = SamplingParams(max_new_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    text_ids = tok.encode("The quick brown fox jumps over the lazy dog. " * 400, add_special_tokens=False)
    run_timed(engine, [GenerateRequest(text_ids[:64], SamplingParams(max_new_tokens=2))])  # warm-up
    out = {
        "bench": "engine",
        "weights": model.weights,
        "requested": fmt,
        "weights_reason": model.weights_reason,
        "attention": engine.info.attention_backend,
        "model": engine.model_name,
        "threads": torch.get_num_threads(),
        "linear_bytes": _linear_bytes(model),
    }
    for n in prefill:
        out[f"prefill_tok_s_{_label(n)}"] = _prefill_rate(engine, text_ids[:n])
    prompt = _prompt(tok, TOPICS[0])
    s0 = engine.stats()
    run_timed(engine, [GenerateRequest(prompt, SamplingParams(max_new_tokens=1, temperature=0.0))])
    s1 = engine.stats()
    prefill_pass = (s1.forward_seconds - s0.forward_seconds) / max(1, s1.forward_passes - s0.forward_passes)
    b1 = run_timed(engine, [GenerateRequest(prompt, greedy)])
    after = engine.stats()
    out["decode_tok_s_b1"] = (new_tokens - 1) / (b1[0].finished - b1[0].first_token)
    passes = after.forward_passes - s1.forward_passes
    # the model runner's own time per decode pass of that run: its first pass is the prompt's, timed
    # alone just before (no radix cache here, so it is the same pass) and taken out
    forward_b1 = (after.forward_seconds - s1.forward_seconds - prefill_pass) / max(1, passes - 1)
    for b in (16,) if quick else (16, 64):
        prompts = [_prompt(tok, TOPICS[i % len(TOPICS)]) + [i] for i in range(b)]
        out[f"decode_tok_s_b{b}"] = _decode_rate(run_timed(engine, [GenerateRequest(p, greedy) for p in prompts]))
    # on the engine's own thread: a pass on this one would start a second OpenMP team, which slows
    # the next format's engine (runtime/engine/torch_thread.py)
    context = len(prompt) + new_tokens // 2  # the decode runs' mean context
    attn = engine.runner.attn
    split = engine.call(lambda: _forward_split(model, engine.model_config, attn, context, 3 if quick else 10)).result()
    split16 = engine.call(
        lambda: _forward_split(model, engine.model_config, attn, context, 3 if quick else 10, batch_size=16)
    ).result()
    long_ids = text_ids[: max(prefill)]
    pre = engine.call(
        lambda: _prefill_split(model, engine.model_config, attn, long_ids, engine.config.chunked_prefill_tokens)
    ).result()
    engine.shutdown()
    step = 1.0 / out["decode_tok_s_b1"]
    fwd = min(forward_b1, step)  # the profiled pass gives the shares of the forward, the run its length
    out["step_ms_b1"] = step * 1e3
    out["step_linear_ms"] = fwd * split["linear_frac"] * 1e3
    out["step_attention_ms"] = fwd * split["attention_frac"] * 1e3
    out["step_other_model_ops_ms"] = fwd * (1 - split["linear_frac"] - split["attention_frac"]) * 1e3
    out["step_engine_ms"] = (step - fwd) * 1e3  # sampling, grammar, scheduling, detokenizing
    out["step_overhead_frac"] = (out["step_other_model_ops_ms"] + out["step_engine_ms"]) / out["step_ms_b1"]
    # a batch-16 decode pass alone (model only, the profiler's shares of its best time): what the
    # b16 ratio is made of
    out["forward_b16_ms"] = split16["forward_s"] * 1e3
    out["forward_b16_linear_ms"] = split16["forward_s"] * split16["linear_frac"] * 1e3
    out["forward_b16_attention_ms"] = split16["forward_s"] * split16["attention_frac"] * 1e3
    out["prefill_split_tokens"] = len(long_ids)
    out["prefill_split_ms"] = pre["prefill_s"] * 1e3
    out["prefill_split_linear_ms"] = pre["prefill_s"] * pre["linear_frac"] * 1e3
    out["prefill_split_attention_ms"] = pre["prefill_s"] * pre["attention_frac"] * 1e3
    return out


def run(quick: bool = False, argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench engine")
    ap.add_argument(
        "--formats",
        default="fp32,auto,bf16,q8,q4",  # CPU formats; the bench runs on CPU
        help="weight formats, the first the reference (default: fp32,auto,bf16,q8,q4; also q4k: a Q4_K_M file)",
    )
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    ap.add_argument(
        "--prefill-tokens",
        default=None,
        metavar="N,N,...",
        help="prompt lengths of the prefill runs, the longest also the prefill split's (default 1024,3072; "
        "--quick 1024; at most 4000)",
    )
    ap.add_argument(
        "--prefill-only",
        default=None,
        metavar="N,N,...",
        help="only the prefill split, at these prompt lengths in tokens (e.g. 1024,3072,8192), no decode runs",
    )
    args = ap.parse_args(argv or [])
    try:
        formats = [(requested, *parse_format(requested)) for requested in args.formats.split(",")]
        lengths = [int(n) for n in args.prefill_only.split(",")] if args.prefill_only else None
    except ValueError as e:
        ap.error(str(e))
    try:
        prefill = tuple(int(n) for n in args.prefill_tokens.split(",")) if args.prefill_tokens else None
    except ValueError:
        ap.error(f"--prefill-tokens: comma-separated token counts, not {args.prefill_tokens!r}")
    if prefill is not None and not (0 < min(prefill) and max(prefill) <= 4000):
        ap.error("--prefill-tokens: prompt lengths from 1 to 4000 tokens")
    if lengths is not None:
        if not lengths or min(lengths) < 1:
            ap.error("--prefill-only: positive prompt lengths")
        first: dict[int, dict] = {}
        for requested, fmt, settings in formats:
            for line in _prefill_only(fmt, args.threads, settings, lengths):
                line["requested"] = requested
                ref_line = first.setdefault(line["tokens"], line)
                line[f"prefill_ms_vs_{ref_line['requested']}"] = line["prefill_ms"] / ref_line["prefill_ms"]
                emit(line)
        return
    ref = None
    done = set()
    cpu = torch.device("cpu")
    invariant = make_attention_backend("auto", cpu).batch_invariant  # what the engines will use
    for requested, fmt, settings in formats:
        fmt, model_file = _model_for(fmt)
        resolved, reason = resolve_format(resolve_model_dir(model_file), fmt, cpu, torch.float32, invariant)
        key = (resolved, model_file, tuple(sorted(settings.items())))
        if key in done:  # auto chose a format measured already: report the choice only
            emit({"bench": "engine", "requested": requested, "weights": resolved, "weights_reason": reason})
            continue
        done.add(key)
        res = _measure(fmt, quick, args.threads, settings, model_file, prefill)
        res["requested"] = requested
        ref = ref or res
        for key in [k for k in res if k.startswith(("prefill_tok_s", "decode_tok_s"))]:
            res[f"{key}_vs_{ref['weights']}"] = res[key] / ref[key]
        # the most the prefill ratio could reach with this attention and linears that took no time
        res[f"prefill_split_ceiling_vs_{ref['weights']}"] = ref["prefill_split_ms"] / res["prefill_split_attention_ms"]
        emit(res)
