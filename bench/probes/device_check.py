"""GPU device check for the CUDA path: Triton kernels against the torch backend, then speed.

    bash bench/device_check.sh            # on a CUDA machine (H100/H200: a few minutes)
    bash bench/device_check.sh --smoke    # anywhere: tiny sizes on CPU under TRITON_INTERPRET=1
    python -m bench.probes.device_check --aot 80,90   # compile every kernel for those SM archs (no GPU needed)

One JSON line per result. Sections:
- `check`: extend/decode attention vs `TorchAttentionBackend` (mixed lengths, cached prefixes,
  split-K, GQA 1/4/8, fp32/fp16/bf16); bitmask kernel vs the torch version; decode logits replayed
  from CUDA graphs vs eager.
- `model`: prefill and decode tokens/s of a random-weight ~1.2B Llama (hidden 2048, 16 layers,
  32 heads, 8 KV heads, intermediate 8192, vocab 128256) in bf16 at batch 1/16/64, decode with
  and without CUDA graphs.
- `bitmask`: the mask kernel on 64 x 128256 logits (target < 20 us).
- `decode_attention`: our decode attention (slot-table gather) vs torch SDPA on contiguous KV of
  the same lengths (target: within 2x).
- `cascade`: shared-prefix decode (32 decodes under a 3k-token prefix, ~100 private tokens each)
  through the Triton kernels equals the torch backend; its step time with cascade on and off
  against the same batch over the private tokens alone (issue #15's ratio, target <= 1.5).

It imports only runtime modules that need nothing but torch and triton (no xgrammar, litestar,
msgspec or transformers), because the GPU machine has only those; the last line says which
third-party modules were loaded. Exit status 1 if any check failed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback

from bench.harness.device_cases import (
    aot_compile,
    attention_case,
    bench_bitmask,
    bench_decode_attention,
    build_model,
    emit,
    graph_time_us,
    shared_prefix_case,
    sync_device,
    time_us,
)

FULL = dict(
    model=dict(vocab=128256, hidden=2048, inter=8192, layers=16, heads=32, kv_heads=8),
    batches=(1, 16, 64),
    prompt=512,
    decode_steps=32,
    bitmask=(64, 128256),
    bitmask_blocks=(1024, 2048, 4096, 8192),
    attn_cases=((1, 4096), (16, 2048), (64, 1024), (64, 4096)),
    # (head_dim, (heads, kv_heads), dtypes): every GQA ratio in bf16, the others at one shape
    kernel_cases=dict(
        shapes=[
            (64, (32, 32), "bf16 fp32"),
            (64, (32, 8), "bf16 fp16 fp32"),
            (64, (32, 4), "bf16"),
            (128, (32, 8), "bf16 fp16"),
            (128, (32, 32), "bf16"),
        ],
        long=3000,
        slots=12_000,
    ),
    graph_sizes=(1, 2, 4, 8, 16, 32, 64),
    iters=50,
    # issue #15's agent step: 32 decodes under a 3k-token shared prefix, ~100 private tokens each;
    # SmolLM2-135M's heads and the ~1.2B model's
    cascade=dict(members=32, shared=3000, private=100, shapes=[(9, 3, 64), (32, 8, 64)]),
)
SMOKE = dict(  # batch 3 replays through the padded size-4 path
    model=dict(vocab=512, hidden=64, inter=128, layers=2, heads=4, kv_heads=2),
    batches=(1, 3),
    prompt=8,
    decode_steps=1,
    bitmask=(4, 1000),
    bitmask_blocks=(256,),
    attn_cases=((2, 40),),
    kernel_cases=dict(shapes=[(16, (8, 2), "fp32 fp16 bf16")], long=70, slots=600),
    graph_sizes=(1, 2, 4),
    iters=1,
    cascade=dict(members=5, shared=40, private=6, shapes=[(6, 2, 16)]),
)
FORBIDDEN = (
    "xgrammar",
    "litestar",
    "msgspec",
    "transformers",
    "tokenizers",
    "safetensors",
    "uvicorn",
    "gguf",
    "jsonschema",
)


# ------------------------------------------------------------------------------------------ timing


# ------------------------------------------------------------------------------------------ checks


def check_attention(sizes, device) -> bool:
    import torch

    from runtime.attention import TorchAttentionBackend
    from runtime.attention.triton_backend import TritonAttentionBackend

    kc = sizes["kernel_cases"]
    long = kc["long"]
    # extend without prefix, extend after a cached prefix, decodes short and long, a 1-token request
    specs = [(long // 3, long // 3), (long, 1), (long // 2 + 7, 13), (1, 1), (long // 2, 1), (long // 5 + 3, 3)]
    tol = {torch.float32: 2e-3 if device.type == "cuda" else 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}
    dtypes = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
    ok = True
    seed = 0
    for dim, (heads, kv_heads), names in kc["shapes"]:
        for dtype in (dtypes[n] for n in names.split()):
            seed += 1
            q, k, v, batch = attention_case(specs, heads, kv_heads, dim, dtype, device, kc["slots"], seed)
            ref = TorchAttentionBackend()
            ref.prepare(batch)
            want = ref.forward(q, k, v).float()
            for splits in (1, 4):
                tri = TritonAttentionBackend(max_kv_splits=splits, min_split_tokens=16)
                tri.prepare(batch)
                got = tri.forward(q, k, v).float()
                err = (got - want).abs().max().item()
                good = bool(torch.isfinite(got).all()) and err <= tol[dtype]
                ok &= good
                emit(
                    check="attention",
                    dim=dim,
                    heads=heads,
                    kv_heads=kv_heads,
                    dtype=str(dtype)[6:],
                    kv_splits=splits,
                    max_abs_err=err,
                    ok=good,
                )
    return ok


def check_bitmask(sizes, device) -> bool:
    import torch

    from runtime.decode.sampler import apply_bitmask_
    from runtime.decode.triton_bitmask import apply_token_bitmask_triton

    ok = True
    b, vocab = sizes["bitmask"]
    g = torch.Generator().manual_seed(1)
    for dtype in (torch.float32, torch.bfloat16):
        logits = torch.randn(b, vocab, generator=g).to(device=device, dtype=dtype)
        words = torch.randint(-(2**31), 2**31 - 1, (b, (vocab + 31) // 32), generator=g, dtype=torch.int64)
        mask = words.to(torch.int32).to(device)
        rows = torch.arange(0, b, 2, device=device)
        want, got = logits.clone(), logits.clone()
        apply_bitmask_(want, mask, rows)
        apply_token_bitmask_triton(got, mask, rows)
        good = torch.equal(want, got)
        ok &= good
        emit(check="bitmask", dtype=str(dtype)[6:], batch=b, vocab=vocab, ok=good)
    return ok


# ------------------------------------------------------------------------------------------ model


class _Requests:
    """B requests with contiguous slot ranges, prefilled to `prompt` tokens, then decoded."""

    def __init__(self, b: int, prompt: int, room: int, vocab: int, device):
        import torch

        self.b, self.len, self.vocab, self.device = b, 0, vocab, device
        self.slots = torch.arange(b * room, dtype=torch.int64).view(b, room)
        self.prompt = prompt

    def prefill_batch(self):
        import torch

        from runtime.forward_batch import ForwardBatch

        p, b = self.prompt, self.b
        ids = torch.randint(0, self.vocab, (b * p,), device=self.device)
        pos = torch.arange(p, device=self.device).repeat(b)
        out_slots = self.slots[:, :p].reshape(-1)
        logits_index = torch.arange(p - 1, b * p, p, device=self.device)
        return ForwardBatch(ids, pos, out_slots, [p] * b, [p] * b, [self.slots[i, :p] for i in range(b)], logits_index)

    def decode_batch(self, step: int):
        import torch

        from runtime.forward_batch import ForwardBatch

        n = self.prompt + step  # tokens before this one
        b = self.b
        ids = torch.randint(0, self.vocab, (b,), device=self.device)
        pos = torch.full((b,), n, dtype=torch.int64, device=self.device)
        return ForwardBatch(
            ids,
            pos,
            self.slots[:, n].clone(),
            [1] * b,
            [n + 1] * b,
            [self.slots[i, : n + 1] for i in range(b)],
            torch.arange(b, device=self.device),
        )


def bench_model(sizes, device, smoke: bool) -> bool:
    import torch

    from runtime.attention.triton_backend import TritonAttentionBackend
    from runtime.kvcache.pool import KVPool
    from runtime.model.cuda_graphs import DecodeCudaGraphs

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    steps, prompt = sizes["decode_steps"], sizes["prompt"]
    room = prompt + steps + 2
    max_b = max(sizes["batches"])
    t0 = time.perf_counter()
    cfg, model, params = build_model(sizes["model"], device, dtype, max_positions=room + 8)
    kv = KVPool(cfg.num_layers, max_b * room, cfg.num_kv_heads, cfg.head_dim, dtype, device)
    emit(
        section="model",
        params_m=round(params / 1e6, 1),
        dtype=str(dtype)[6:],
        layers=cfg.num_layers,
        build_s=time.perf_counter() - t0,
    )
    attn = TritonAttentionBackend()
    graphs = DecodeCudaGraphs(model, kv, max_b, room, batch_sizes=sizes["graph_sizes"], capture=device.type == "cuda")
    ok = True
    rates = {}
    for b in sizes["batches"]:
        reqs = _Requests(b, prompt, room, cfg.vocab_size, device)
        batch = reqs.prefill_batch()
        model.forward(batch, kv, attn)  # warm-up (compiles kernels for this shape class)
        sync_device(device)
        t = time.perf_counter()
        model.forward(batch, kv, attn)
        sync_device(device)
        prefill_s = time.perf_counter() - t

        # graph replay equals eager for the first decode step (same inputs, same KV writes)
        step0 = reqs.decode_batch(0)
        eager = model.forward(step0, kv, attn).float()
        replay = graphs.run(step0).float()
        err = (eager - replay).abs().max().item()
        same = (eager.argmax(-1) == replay.argmax(-1)).float().mean().item()
        good = err <= (5e-2 if dtype == torch.bfloat16 else 1e-4) * max(1.0, eager.abs().max().item())
        ok &= good
        emit(check="cuda_graph_decode", batch=b, replayed=graphs.capture, max_abs_err=err, argmax_agree=same, ok=good)

        timings = {}
        for mode in ("eager", "graph"):
            sync_device(device)
            t = time.perf_counter()
            for s in range(steps):
                db = reqs.decode_batch(s)
                (model.forward(db, kv, attn) if mode == "eager" else graphs.run(db)).argmax(-1)
            sync_device(device)
            timings[mode] = time.perf_counter() - t
        rates[b] = {m: b * steps / s for m, s in timings.items()}
        emit(
            section="model",
            batch=b,
            prompt=prompt,
            prefill_tok_s=b * prompt / prefill_s,
            decode_tok_s_eager=rates[b]["eager"],
            decode_tok_s_graph=rates[b]["graph"],
            decode_ms_per_step_graph=timings["graph"] / steps * 1e3,
            decode_steps=steps,
        )
    lo, hi = min(rates), max(rates)
    best = lambda b: max(rates[b].values())
    emit(section="model", decode_scaling=f"batch {hi} vs {lo}", ratio=best(hi) / best(lo), target=">= 20")
    return ok


# ------------------------------------------------------------------------------------------ cascade


def bench_cascade(sizes, device) -> bool:
    """Shared-prefix decode through the Triton kernels: equal to the torch backend's plain
    attention, and the step time of `members` decodes over a long shared prefix (cascade on and
    off) against the same batch over private contexts of the suffix length alone (issue #15's
    ratio, target <= 1.5)."""
    import torch

    from runtime.attention import TorchAttentionBackend
    from runtime.attention.triton_backend import TritonAttentionBackend

    c = sizes["cascade"]
    tol = {torch.float32: 2e-3 if device.type == "cuda" else 1e-5, torch.bfloat16: 3e-2}
    ok = True
    for heads, kv_heads, dim in c["shapes"]:
        for dtype in (torch.float32, torch.bfloat16):
            q, k, v, batch, groups = shared_prefix_case(
                c["members"], c["shared"], c["private"], 3, heads, kv_heads, dim, dtype, device, seed=heads
            )
            ref = TorchAttentionBackend()
            ref.prepare(batch)
            want = ref.forward(q, k, v).float()
            batch.prefix_groups = groups
            tri = TritonAttentionBackend()
            tri.prepare(batch)
            got = tri.forward(q, k, v).float()
            err = (got - want).abs().max().item()
            good = bool(groups) and tri.decode.prefix is not None and err <= tol[dtype]
            ok &= good
            emit(
                check="cascade",
                heads=heads,
                kv_heads=kv_heads,
                dim=dim,
                dtype=str(dtype)[6:],
                groups=[len(gr.members) for gr in groups],
                max_abs_err=err,
                ok=good,
            )
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        rec = dict(
            section="cascade",
            heads=heads,
            kv_heads=kv_heads,
            dim=dim,
            dtype=str(dtype)[6:],
            batch=c["members"],
            shared=c["shared"],
            private=c["private"],
        )
        for name, shared, cascade in (
            ("shared_cascade", c["shared"], True),
            ("shared_plain", c["shared"], False),
            ("private_only", 0, False),
        ):
            q, k, v, batch, groups = shared_prefix_case(
                c["members"], shared, c["private"], 0, heads, kv_heads, dim, dtype, device, seed=1
            )
            batch.prefix_groups = groups if cascade else []
            attn = TritonAttentionBackend()
            attn.prepare(batch)
            attn.forward(q, k, v)  # sizes the splits and the prefix tasks
            fn = lambda: attn.forward(q, k, v)  # noqa: E731 (bound per case)
            rec[f"{name}_us"] = time_us(fn, device, sizes["iters"])
            rec[f"{name}_graph_us"] = graph_time_us(fn, device, sizes["iters"])
        best = lambda n: rec[f"{n}_graph_us"] or rec[f"{n}_us"]  # noqa: E731
        rec.update(
            cascade_vs_private=best("shared_cascade") / best("private_only"),
            plain_vs_private=best("shared_plain") / best("private_only"),
            target="<= 1.5",
        )
        emit(**rec)
    return ok


# ------------------------------------------------------------------------------------------ AOT


# ------------------------------------------------------------------------------------------ main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.probes.device_check", description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true", help="tiny sizes on CPU under TRITON_INTERPRET=1")
    ap.add_argument("--aot", metavar="ARCHS", help="only compile the kernels for these SM archs, e.g. 80,90")
    ap.add_argument("--quick", action="store_true", help="with --aot: bf16 kernels and the float32 mask only")
    ap.add_argument(
        "--skip", default="", help="comma-separated sections to skip: check,model,bitmask,attention,cascade"
    )
    args = ap.parse_args(argv)
    if args.aot:
        if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
            print("--aot needs the real compiler: unset TRITON_INTERPRET", file=sys.stderr)
            return 2
        return 0 if aot_compile([int(a) for a in args.aot.split(",")], args.quick) else 1
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"  # before any kernel module is imported (kernels bind at import)

    import torch

    skip = set(filter(None, args.skip.split(",")))
    if args.smoke:
        device, sizes = torch.device("cpu"), SMOKE
        torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    elif torch.cuda.is_available():
        device, sizes = torch.device("cuda"), FULL
    else:
        print("no CUDA device: run with --smoke for the CPU code-path check", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    emit(
        section="device",
        device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (interpreter)",
        torch=torch.__version__,
        triton=__import__("triton").__version__,
        smoke=args.smoke,
    )
    t_all = time.perf_counter()
    failed = []
    sections = [  # the checks first, then the issue ratios, then the slower model bench
        ("check", lambda: check_attention(sizes, device) & check_bitmask(sizes, device)),
        ("cascade", lambda: bench_cascade(sizes, device)),
        ("attention", lambda: bench_decode_attention(sizes, device)),
        ("bitmask", lambda: bench_bitmask(sizes, device)),
        ("model", lambda: bench_model(sizes, device, args.smoke)),
    ]
    for name, fn in sections:
        if name in skip:
            continue
        t = time.perf_counter()
        try:
            if fn() is False:
                failed.append(name)
        except Exception as e:
            failed.append(name)
            emit(section=name, ok=False, error=f"{type(e).__name__}: {e}", trace=traceback.format_exc()[-2000:])
        emit(section=name, done_s=time.perf_counter() - t)
    loaded = sorted({m.split(".")[0] for m in sys.modules} & set(FORBIDDEN))
    if loaded:
        failed.append("imports")
    emit(check="imports", forbidden_loaded=loaded, ok=not loaded)
    emit(section="summary", ok=not failed, failed=failed, total_s=time.perf_counter() - t_all)
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
