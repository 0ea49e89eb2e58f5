"""What the CUDA device check (bench/probes/device_check.py) is built from: timing on a device
(eager and replayed from a CUDA graph), the attention and shared-prefix cases it compares, the
random-weight Llama it times, and the ahead-of-time kernel compile. Imports nothing but torch and
triton (and runtime modules that need only those): the GPU machine has only those."""

from __future__ import annotations

import json
import time


def emit(**record) -> None:
    print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in record.items()}), flush=True)


def sync_device(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_us(fn, device, iters: int) -> float:
    """Wall time per call of back-to-back eager calls (launch overhead included)."""
    for _ in range(2):
        fn()
    sync_device(device)
    t = time.perf_counter()
    for _ in range(iters):
        fn()
    sync_device(device)
    return (time.perf_counter() - t) / iters * 1e6


def graph_time_us(fn, device, iters: int) -> float | None:
    """GPU time per call, replayed from a CUDA graph (no launch overhead). None off CUDA."""
    import torch

    if device.type != "cuda":
        return None
    fn()
    torch.cuda.synchronize(device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    torch.cuda.synchronize(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        graph.replay()
    end.record()
    torch.cuda.synchronize(device)
    return start.elapsed_time(end) / iters * 1e3


def attention_case(specs, heads, kv_heads, dim, dtype, device, slots, seed):
    """A packed batch: specs = [(seq_len, extend_len)]; slots scattered over the pool."""
    import torch

    from runtime.forward_batch import ForwardBatch

    g = torch.Generator().manual_seed(seed)
    gd = torch.Generator(device=device).manual_seed(seed)
    k = torch.randn(slots + 1, kv_heads, dim, generator=gd, device=device).to(dtype)
    v = torch.randn(slots + 1, kv_heads, dim, generator=gd, device=device).to(dtype)
    perm = torch.randperm(slots, generator=g)
    rows, used = [], 0
    for seq, _ in specs:
        rows.append(perm[used : used + seq])
        used += seq
    t = sum(e for _, e in specs)
    q = torch.randn(t, heads, dim, generator=gd, device=device).to(dtype)
    zeros = torch.zeros(t, dtype=torch.int64, device=device)
    batch = ForwardBatch(
        zeros,
        zeros,
        zeros,
        [e for _, e in specs],
        [s for s, _ in specs],
        rows,
        torch.zeros(0, dtype=torch.int64, device=device),
    )
    return q, k, v, batch


def build_model(spec, device, dtype, max_positions: int):
    import torch

    from runtime.model.config import ModelConfig
    from runtime.model.decoder import DecoderModel

    h, inter, heads, kvh = spec["hidden"], spec["inter"], spec["heads"], spec["kv_heads"]
    d = h // heads
    cfg = ModelConfig(
        vocab_size=spec["vocab"],
        hidden_size=h,
        intermediate_size=inter,
        num_layers=spec["layers"],
        num_heads=heads,
        num_kv_heads=kvh,
        head_dim=d,
        rope_theta=500000.0,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
    )
    g = torch.Generator(device=device).manual_seed(0)

    def rand(*shape):
        return (torch.randn(*shape, generator=g, device=device, dtype=torch.float32) * 0.02).to(dtype)

    w = {
        "model.embed_tokens.weight": rand(cfg.vocab_size, h),
        "model.norm.weight": torch.ones(h, device=device, dtype=dtype),
    }
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        w.update(
            {
                p + "input_layernorm.weight": torch.ones(h, device=device, dtype=dtype),
                p + "post_attention_layernorm.weight": torch.ones(h, device=device, dtype=dtype),
                p + "self_attn.q_proj.weight": rand(heads * d, h),
                p + "self_attn.k_proj.weight": rand(kvh * d, h),
                p + "self_attn.v_proj.weight": rand(kvh * d, h),
                p + "self_attn.o_proj.weight": rand(h, heads * d),
                p + "mlp.gate_proj.weight": rand(inter, h),
                p + "mlp.up_proj.weight": rand(inter, h),
                p + "mlp.down_proj.weight": rand(h, inter),
            }
        )
    model = DecoderModel(cfg, w, device, dtype)
    del w
    params = sum(
        t.numel()
        for t in [model.embed, model.norm]
        + [
            x
            for layer in model.layers
            for x in (layer.qkv, layer.o_proj, layer.gate_up, layer.down, layer.input_norm, layer.post_norm)
        ]
    )
    return cfg, model, params


def shared_prefix_case(members, shared, private, others, heads, kv_heads, dim, dtype, device, seed):
    """`members` decodes over one shared prefix of `shared` slots plus `private` of their own each,
    and `others` private decodes of `shared` + `private` positions; slots scattered over the pool.
    Returns q, k, v, the batch and its prefix groups (found as the engine finds them)."""
    import torch

    from runtime.attention.cascade import find_prefix_groups
    from runtime.forward_batch import ForwardBatch

    g = torch.Generator().manual_seed(seed)
    b = members + others
    slots = shared + b * private + others * shared
    perm = torch.randperm(slots, generator=g)
    prefix, used, rows = perm[:shared], shared, []
    for i in range(b):
        own = perm[used : used + private + (shared if i >= members else 0)]
        used += own.numel()
        rows.append(torch.cat([prefix, own]) if i < members else own)
    gd = torch.Generator(device=device).manual_seed(seed)
    k = torch.randn(slots + 1, kv_heads, dim, generator=gd, device=device).to(dtype)
    v = torch.randn(slots + 1, kv_heads, dim, generator=gd, device=device).to(dtype)
    q = torch.randn(b, heads, dim, generator=gd, device=device).to(dtype)
    zeros = torch.zeros(b, dtype=torch.int64, device=device)
    lens = [r.numel() for r in rows]
    batch = ForwardBatch(zeros, zeros, zeros, [1] * b, lens, rows, torch.arange(b, device=device))
    groups = find_prefix_groups([1] * b, lens, rows, max_extend=1, min_shared=16, min_saved=0)
    return q, k, v, batch, groups


def aot_compile(archs: list[int], quick: bool = False) -> bool:
    """Compile every kernel configuration the launchers use, for each SM arch, without a GPU
    (triton ships ptxas). Catches compile errors and shared-memory overruns before GPU time is spent."""
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from runtime.attention import triton_backend as ta
    from runtime.decode import triton_bitmask as tb

    shared_limit = {80: 163 * 1024, 86: 99 * 1024, 89: 99 * 1024, 90: 227 * 1024}
    tname = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}

    def build(kernel, types: dict, cfg: dict, arch: int) -> dict:
        consts = {k: v for k, v in cfg.items() if k not in ("num_warps", "num_stages")}
        opts = {k: v for k, v in cfg.items() if k in ("num_warps", "num_stages")}
        sig = {name: ("constexpr" if name in consts else types.get(name, "i32")) for name in kernel.arg_names}
        t = time.perf_counter()
        compiled = triton.compile(
            ASTSource(kernel, sig, constexprs=consts), target=GPUTarget("cuda", arch, 32), options=opts
        )
        shared = compiled.metadata.shared
        return dict(
            shared_bytes=shared, compile_s=time.perf_counter() - t, ok=shared <= shared_limit.get(arch, 99 * 1024)
        )

    ok = True
    for arch in archs:
        jobs = []
        # quick: the serving dtype (bf16) at the common head shapes, and the float32 logits mask
        for dtype in (torch.bfloat16, torch.float32) if quick else (torch.bfloat16, torch.float16, torch.float32):
            p = "*" + tname[dtype]
            for dim in (64, 128) if dtype != torch.float32 or not quick else ():
                for heads, kvh in ((32, 8), (32, 32)) if quick else ((32, 8), (32, 32), (64, 2)):
                    ext = ta.extend_config(heads, kvh, dim, dtype, on_gpu=True)
                    types = dict(
                        Q=p, K=p, V=p, O=p, QStart="*i32", ExtLen="*i32", SeqLen="*i32", Table="*i32", sm_scale="fp32"
                    )
                    types["Sinks"] = "*fp32"  # compiled with its attention-sink branch (gpt-oss)
                    ext = {**ext, "HAS_SINKS": True}
                    jobs.append((f"extend {tname[dtype]} d{dim} h{heads}/{kvh}", ta.extend_kernel, types, ext))
                    _, split, merge = ta.decode_config(heads, kvh, dim, dtype, on_gpu=True)
                    types = dict(
                        Q=p,
                        K=p,
                        V=p,
                        MidO="*fp32",
                        MidLse="*fp32",
                        QRows="*i32",
                        SeqLen="*i32",
                        KvStart="*i32",
                        NumSplits="*i32",
                        Table="*i32",
                        sm_scale="fp32",
                    )
                    jobs.append((f"decode {tname[dtype]} d{dim} h{heads}/{kvh}", ta.decode_split_kernel, types, split))
                    prefix = ta.prefix_config(heads, kvh, dim, dtype, on_gpu=True)
                    types = dict(
                        Q=p,
                        K=p,
                        V=p,
                        MidO="*fp32",
                        MidLse="*fp32",
                        QRows="*i32",
                        Members="*i32",
                        SharedLen="*i32",
                        NumSplits="*i32",
                        Table="*i32",
                        sm_scale="fp32",
                    )
                    jobs.append((f"prefix {tname[dtype]} d{dim} h{heads}/{kvh}", ta.prefix_split_kernel, types, prefix))
                    if heads == 32 and kvh == 8:
                        types = dict(
                            MidO="*fp32",
                            MidLse="*fp32",
                            O=p,
                            QRows="*i32",
                            SeqLen="*i32",
                            KvStart="*i32",
                            NumSplits="*i32",
                            PrefixSplits="*i32",
                            Sinks="*fp32",
                        )
                        merge = {**merge, "HAS_SINKS": True}  # with its attention-sink branch (gpt-oss)
                        jobs.append((f"merge {tname[dtype]} d{dim}", ta.decode_merge_kernel, types, merge))
            jobs.append(
                (
                    f"bitmask {tname[dtype]}",
                    tb.bitmask_kernel,
                    dict(Logits=p, Mask="*i32", Rows="*i32"),
                    dict(BLOCK=2048, WORDS=False, num_warps=4),
                )
            )
            jobs.append(
                (
                    f"bitmask words {tname[dtype]}",
                    tb.bitmask_kernel,
                    dict(Logits=p, Mask="*i32", Rows="*i32"),
                    dict(BLOCK=4096, WORDS=True, num_warps=8),
                )
            )
        for name, kernel, types, cfg in jobs:
            try:
                rec = build(kernel, types, cfg, arch)
            except Exception as e:
                rec = dict(ok=False, error=f"{type(e).__name__}: {str(e)[:400]}")
            ok &= rec["ok"]
            emit(check="aot_compile", arch=f"sm_{arch}", kernel=name, **rec)
    return ok


# ------------------------------------------------------------------------------------------ kernels


def bench_bitmask(sizes, device) -> None:
    """The shipped configuration, then a sweep of block size x warps x layout (same work, same
    answer), so the default can be set from what this GPU measured."""
    import torch

    from runtime.decode.sampler import apply_bitmask_
    from runtime.decode.triton_bitmask import DEFAULT_CONFIG, apply_token_bitmask_triton

    b, vocab = sizes["bitmask"]
    base = torch.randn(b, vocab, device=device)
    logits = base.clone()  # masked in place over and over while timing (the same work each time)
    mask = torch.randint(-(2**31), 2**31 - 1, (b, (vocab + 31) // 32), dtype=torch.int64).to(torch.int32).to(device)
    rows = torch.arange(b, device=device, dtype=torch.int32)
    iters = sizes["iters"]
    tri = lambda: apply_token_bitmask_triton(logits, mask, rows)
    ref = lambda: apply_bitmask_(logits, mask)
    emit(
        section="bitmask",
        batch=b,
        vocab=vocab,
        config=DEFAULT_CONFIG,
        triton_us=time_us(tri, device, iters),
        triton_graph_us=graph_time_us(tri, device, iters),
        torch_us=time_us(ref, device, iters),
        target_us=20,
    )
    want = base.clone()
    apply_bitmask_(want, mask, rows)
    best = None
    for words in (False, True):
        for block in sizes["bitmask_blocks"]:
            for warps in (4, 8):
                cfg = dict(block=block, num_warps=warps, words=words)
                fn = lambda: apply_token_bitmask_triton(logits, mask, rows, **cfg)
                got = base.clone()
                apply_token_bitmask_triton(got, mask, rows, **cfg)
                us = graph_time_us(fn, device, iters) or time_us(fn, device, iters)
                emit(section="bitmask_sweep", **cfg, graph_us=us, ok=bool(torch.equal(got, want)))
                if best is None or us < best[0]:
                    best = (us, cfg)
    emit(section="bitmask_sweep", best=best[1], best_us=best[0], target_us=20)


def bench_decode_attention(sizes, device) -> None:
    import torch
    import torch.nn.functional as F

    from runtime.attention.triton_backend import TritonAttentionBackend
    from runtime.forward_batch import ForwardBatch

    spec = sizes["model"]
    heads, kvh = spec["heads"], spec["kv_heads"]
    dim = spec["hidden"] // heads
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    iters = sizes["iters"]
    for b, length in sizes["attn_cases"]:
        slots = b * length
        k = torch.randn(slots + 1, kvh, dim, device=device, dtype=dtype)
        v = torch.randn(slots + 1, kvh, dim, device=device, dtype=dtype)
        perm = torch.randperm(slots)
        rows = [perm[i * length : (i + 1) * length] for i in range(b)]
        q = torch.randn(b, heads, dim, device=device, dtype=dtype)
        zeros = torch.zeros(b, dtype=torch.int64, device=device)
        batch = ForwardBatch(zeros, zeros, zeros, [1] * b, [length] * b, rows, torch.arange(b, device=device))
        attn = TritonAttentionBackend()
        attn.prepare(batch)
        attn.forward(q, k, v)  # sizes the splits
        # the same keys, laid out contiguously per request, for SDPA
        idx = torch.stack(rows).to(device)
        kc, vc = k[idx].transpose(1, 2).contiguous(), v[idx].transpose(1, 2).contiguous()  # [B, KVH, L, D]
        kx, vx = kc.repeat_interleave(heads // kvh, 1), vc.repeat_interleave(heads // kvh, 1)
        qs = q.unsqueeze(2)
        ours = lambda: attn.forward(q, k, v)
        sdpa_gqa = lambda: F.scaled_dot_product_attention(qs, kc, vc, enable_gqa=True)
        sdpa_mha = lambda: F.scaled_dot_product_attention(qs, kx, vx)
        err = (ours().float() - sdpa_gqa().squeeze(2).float()).abs().max().item()
        rec = dict(
            section="decode_attention",
            batch=b,
            kv_len=length,
            heads=heads,
            kv_heads=kvh,
            dim=dim,
            kv_splits=attn.decode.max_splits,
            max_abs_err=err,
        )
        for name, fn in (("triton", ours), ("sdpa_gqa", sdpa_gqa), ("sdpa_expanded_kv", sdpa_mha)):
            rec[f"{name}_us"] = time_us(fn, device, iters)
            try:
                rec[f"{name}_graph_us"] = graph_time_us(fn, device, iters)
            except Exception as e:  # an SDPA backend that cannot be captured: eager numbers only
                rec[f"{name}_graph_us"] = f"not capturable: {type(e).__name__}"
        best_sdpa = min(
            x
            for x in (
                rec["sdpa_gqa_graph_us"],
                rec["sdpa_expanded_kv_graph_us"],
                rec["sdpa_gqa_us"],
                rec["sdpa_expanded_kv_us"],
            )
            if isinstance(x, float)
        )
        ours_t = rec["triton_graph_us"] if isinstance(rec["triton_graph_us"], float) else rec["triton_us"]
        rec.update(ratio_vs_best_sdpa=ours_t / best_sdpa, target="<= 2")
        emit(**rec)
