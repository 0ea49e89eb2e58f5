"""The whole engine on a GPU: scheduler, radix cache, Triton attention and decode CUDA graphs
together, as `jumpgate serve --device cuda` runs them (bench/probes/device_check.py checks the parts).

    python -m bench.probes.device_engine --tokenizer-dir DIR          # CUDA machine
    python -m bench.probes.device_engine --tokenizer-dir DIR --smoke  # CPU, tiny model, Triton interpreter

The model has SmolLM2-135M's shape (30 layers, 9 heads, 3 KV heads, vocab 49152) with random
weights, because the GPU machine cannot fetch the real ones and they are too large to carry; the
tokenizer files come from DIR (the default model's cache folder). One JSON line per result:

- `engine_check`: greedy outputs of the fp32 engine with Triton attention + CUDA graphs equal the
  fp32 engine with the torch attention backend, token for token, on requests sharing a prefix
  (so radix hits, extend-after-prefix and graph-replayed decode are all on the path; the batch
  forms no shared-prefix group: it saves fewer prefix reads than the Triton backend's threshold).
- `engine_bench`: completion tokens/s of 64 requests sharing a 512-token prefix (bf16), with the
  Triton backend with and without CUDA graphs, with graphs and cascade off, and with the torch
  backend; and batch 1. (bench/results/gpu_h200_device_engine_f4d31d4.jsonl and _bench_e79fc87
  ran before the Triton threshold, when this workload formed groups.)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

from bench.probes.device_check import emit

SMOLLM2_SHAPE = dict(
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
)
TINY_SHAPE = dict(
    vocab_size=49152,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
)
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "special_tokens_map.json",
    "generation_config.json",
)


def make_model_dir(out: Path, tokenizer_dir: Path, shape: dict) -> Path:
    """A random-weight Llama folder (config.json + safetensors + the tokenizer files). The lm_head
    is scaled up so greedy choices are clear-cut rather than near-ties between fp32 backends."""
    import torch
    from safetensors.torch import save_file

    cfg = dict(
        shape,
        model_type="llama",
        architectures=["LlamaForCausalLM"],
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        rope_theta=100000.0,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
    )
    h, inter, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    d = h // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d
    g = torch.Generator().manual_seed(0)

    def rand(*s, std=0.02):
        return torch.randn(*s, generator=g) * std

    w = {
        "model.embed_tokens.weight": rand(cfg["vocab_size"], h),
        "model.norm.weight": torch.ones(h),
        "lm_head.weight": rand(cfg["vocab_size"], h, std=0.16),
    }
    for i in range(layers):
        p = f"model.layers.{i}."
        w.update(
            {
                p + "input_layernorm.weight": torch.ones(h),
                p + "post_attention_layernorm.weight": torch.ones(h),
                p + "self_attn.q_proj.weight": rand(q, h),
                p + "self_attn.k_proj.weight": rand(kv, h),
                p + "self_attn.v_proj.weight": rand(kv, h),
                p + "self_attn.o_proj.weight": rand(h, q),
                p + "mlp.gate_proj.weight": rand(inter, h),
                p + "mlp.up_proj.weight": rand(inter, h),
                p + "mlp.down_proj.weight": rand(h, inter),
            }
        )
    out.mkdir(parents=True, exist_ok=True)
    save_file(w, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(cfg))
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).exists():
            shutil.copy(tokenizer_dir / name, out / name)
    return out


def prompts(tokenizer, n: int, prefix_tokens: int, unique_tokens: int) -> list[list[int]]:
    """n prompts: one shared prefix (an agent's system prompt) + a different question each."""
    base = tokenizer.encode(
        "You are a careful assistant that answers with JSON for the given tools. " * 64, add_special_tokens=False
    )
    prefix = (base * (prefix_tokens // len(base) + 1))[:prefix_tokens]
    out = []
    for i in range(n):
        q = tokenizer.encode(f" Question {i}: how many items are in box {i * 7 % 13}? " * 8, add_special_tokens=False)
        out.append(prefix + q[:unique_tokens])
    return out


def run_batch(engine, ids_list, max_tokens: int):
    from runtime.api import GenerateRequest
    from runtime.decode.sampling import SamplingParams

    sp = SamplingParams(temperature=0.0, max_new_tokens=max_tokens, ignore_eos=True)
    t = time.perf_counter()
    res = engine.generate_many([GenerateRequest(prompt_ids=ids, sampling=sp) for ids in ids_list], timeout=600)
    return res, time.perf_counter() - t


def make_engine(model_dir: Path, device: str, profile=None, **kw):
    from runtime.engine.engine import Engine

    engine = Engine(
        model=str(model_dir),
        device=device,
        kv_pool_tokens=kw.pop("kv_pool_tokens", 65536),
        max_running_requests=64,
        **kw,
    ).start()
    if profile is not None:  # cProfile of the engine thread (enable() profiles the thread it runs on)
        engine.call(profile.enable).result(timeout=60)
    return engine


def check_outputs(model_dir: Path, device: str, smoke: bool) -> bool:
    n, max_tokens = (4, 6) if smoke else (16, 48)
    outs = {}
    for backend, graphs in (("torch", False), ("triton", True)):
        eng = make_engine(
            model_dir, device, dtype="float32", attention_backend=backend, cuda_graphs=graphs, kv_pool_tokens=16384
        )
        ids = prompts(eng.tokenizer, n, 40 if smoke else 300, 12)
        first, _ = run_batch(eng, ids[:1], max_tokens)  # the prefix enters the tree; the rest hit it
        rest, _ = run_batch(eng, ids[1:], max_tokens)
        stats = eng.stats()
        outs[backend] = dict(
            tokens=[r.token_ids for r in first + rest],
            cached=sum(r.cached_tokens for r in rest),
            graphs=eng.runner.cuda_graphs is not None,
            leaked=stats.kv_slots_request_only,
        )
        eng.shutdown()
    a, b = outs["torch"]["tokens"], outs["triton"]["tokens"]
    same = sum(x == y for x, y in zip(a, b))
    first_diff = [next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), None) for x, y in zip(a, b)]
    ok = same == len(a) and outs["triton"]["cached"] > 0 and outs["triton"]["leaked"] == 0
    emit(
        check="engine_greedy_equal",
        dtype="float32",
        requests=len(a),
        max_tokens=max_tokens,
        identical=same,
        first_divergence=[d for d in first_diff if d is not None][:8],
        cached_tokens_triton=outs["triton"]["cached"],
        cached_tokens_torch=outs["torch"]["cached"],
        cuda_graphs=outs["triton"]["graphs"],
        leaked_slots=outs["triton"]["leaked"],
        ok=ok,
    )
    return ok


def _top_functions(profile, n: int = 25) -> list:
    import pstats

    st = pstats.Stats(profile)
    rows = sorted(st.stats.items(), key=lambda kv: -kv[1][2])[:n]  # by own time
    return [
        [f"{Path(f).name}:{line}({fn})", nc, round(tt, 4), round(ct, 4)] for (f, line, fn), (_, nc, tt, ct, _) in rows
    ]


def bench_engine(model_dir: Path, device: str, smoke: bool) -> None:
    import cProfile

    n, prefix, max_tokens = (3, 40, 4) if smoke else (64, 512, 128)
    dtype = "float32" if smoke else "bfloat16"
    rates = {}
    # cascade off: no step forms shared-prefix groups (with it on, steps that do replay the graph
    # holding the prefix kernel). A first, unreported run: Triton compiles a kernel again for each
    # new integer specialization (a stride or length divisible by 16, ...), which would land in
    # whichever config ran first.
    # Under the interpreter (smoke) nothing compiles: no warm-up run.
    configs = (
        ("warmup", "triton", True, True),
        ("triton_graphs", "triton", True, True),
        ("triton_graphs_no_cascade", "triton", True, False),
        ("triton_eager", "triton", False, True),
        ("torch", "torch", False, True),
        ("triton_graphs_profiled", "triton", True, True),
    )
    for name, backend, graphs, cascade in configs[1:] if smoke else configs:
        profile = cProfile.Profile() if name.endswith("_profiled") else None
        eng = make_engine(
            model_dir,
            device,
            profile=profile,
            dtype=dtype,
            attention_backend=backend,
            cuda_graphs=graphs,
            cascade_attention=cascade,
        )
        ids = prompts(eng.tokenizer, n + 1, prefix, 32)
        run_batch(eng, ids[:1], 8)  # warm-up: kernels compiled, prefix cached
        res, wall = run_batch(eng, ids[1:], max_tokens)
        toks = sum(r.completion_tokens for r in res)
        one, wall1 = run_batch(eng, [ids[0][:-3]], max_tokens)
        if profile is not None:
            eng.call(profile.disable).result(timeout=60)
        eng.shutdown()
        if name == "warmup":
            continue
        if profile is not None:  # where the engine thread's time goes (profiling slows it down)
            emit(section="engine_profile", config=name, wall_s=wall, top_by_own_time=_top_functions(profile))
            continue
        rates[name] = toks / wall
        emit(
            section="engine_bench",
            config=name,
            dtype=dtype,
            requests=n,
            shared_prefix=prefix,
            max_tokens=max_tokens,
            tok_s=toks / wall,
            wall_s=wall,
            steps_per_s=max_tokens / wall,
            cached_frac=sum(r.cached_tokens for r in res) / sum(r.prompt_tokens for r in res),
            batch1_tok_s=one[0].completion_tokens / wall1,
            cuda_graphs=graphs and device == "cuda",
            cascade=cascade,
        )
    emit(
        section="engine_bench",
        graphs_vs_eager=rates["triton_graphs"] / rates["triton_eager"],
        cascade_vs_graphs_without=rates["triton_graphs"] / rates["triton_graphs_no_cascade"],
        triton_vs_torch=rates["triton_graphs"] / rates["torch"],
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.probes.device_engine", description=__doc__.split("\n")[0])
    ap.add_argument("--tokenizer-dir", required=True, help="folder with the default model's tokenizer.json")
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny model, Triton interpreter")
    ap.add_argument("--skip", default="", help="comma-separated: check,bench")
    args = ap.parse_args(argv)
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"
    import torch

    if not args.smoke and not torch.cuda.is_available():
        print("no CUDA device: run with --smoke for the CPU code-path check", file=sys.stderr)
        return 2
    device = "cpu" if args.smoke else "cuda"
    skip = set(filter(None, args.skip.split(",")))
    failed = []
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        model_dir = make_model_dir(
            Path(tmp) / "model", Path(args.tokenizer_dir), TINY_SHAPE if args.smoke else SMOLLM2_SHAPE
        )
        emit(
            section="engine_model",
            shape="tiny" if args.smoke else "smollm2-135m (random weights)",
            build_s=time.perf_counter() - t,
        )
        for name, fn in (("check", check_outputs), ("bench", bench_engine)):
            if name in skip:
                continue
            t = time.perf_counter()
            try:
                if fn(model_dir, device, args.smoke) is False:
                    failed.append(name)
            except Exception as e:
                failed.append(name)
                emit(
                    section=f"engine_{name}",
                    ok=False,
                    error=f"{type(e).__name__}: {e}",
                    trace=traceback.format_exc()[-2000:],
                )
            emit(section=f"engine_{name}", done_s=time.perf_counter() - t)
    emit(section="engine_summary", ok=not failed, failed=failed)
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
