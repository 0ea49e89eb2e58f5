"""The CPU attention backend (runtime/attention/cpu_backend.py) and its kernel.

- accuracy: equals fp32 SDPA (per request, and the torch backend) within 1e-5 on mixed batches:
  GQA 1/3/4, head_dim not a multiple of 16, unequal lengths, drafts and prompt chunks after cached
  prefixes, scattered slots;
- batch invariance, bitwise: a row's output is the same alone, in a batch with other rows, as a
  decode or inside a longer extend, with 1 or 2 threads, and for any placement of the row in q;
- prefix groups: tiles that read a shared prefix once for several requests change no bit;
- the factory: `auto` on CPU picks it, a failed build falls back to torch with one log line,
  non-fp32 passes go through the torch backend;
- the engine gives the same greedy tokens with it as with torch (tiny model);
- AMX tiles (--attention-tiles, on a CPU with AMX): within 1e-4 of SDPA, the same bitwise
  invariance and prefix-group equality, the vector path's bits where head_dim is not a multiple
  of 32, and only for formats with bf16 activations. At bf16 precision (--attention-precision
  bf16: q and k rounded once to bf16) all the same, its tile rows within 1e-4 of SDPA over the
  bf16-rounded q and k (within 3e-2 of SDPA over the float32 ones). tests/runtime/attention/test_attention_tiles.py runs the engine on them.
- bf16 dot-product scores (bf16 precision on a CPU with AVX512-BF16; `dot`, also on an AMX CPU with
  the AMX path turned off): the same checks as the AMX bf16 precision.
"""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

from runtime.attention import TorchAttentionBackend, make_attention_backend
from runtime.attention.cpu_backend import CpuPagedAttentionBackend
from runtime.forward_batch import ForwardBatch, PrefixGroup

CPU = torch.device("cpu")
TOL = 1e-5
TILES_TOL = 1e-4  # products as bf16 word pairs (hi*hi + lo*hi + hi*lo): close to float32, not equal
# bf16 precision: q and k rounded to bf16 (2^-9 relative) before the scores, against SDPA over the
# float32 q and k (against SDPA over the rounded ones its tile rows are within TILES_TOL)
BF16_TOL = 3e-2
# the vector path, then AMX tiles where the CPU has them, at float32 and at bf16 precision, then
# the bf16 dot-product scores where they are built (on an AMX CPU with AMX turned off for the test)
TILES = [False, True, "bf16", "dot"]
BF16_PATHS = ("bf16", "dot")  # q and k rounded to bf16


@pytest.fixture(autouse=True)
def _dot_without_amx(request):
    """The `dot` cases run with the kernel's AMX path off, so an AMX CPU runs the dot path too."""
    if getattr(request.node, "callspec", None) is not None and request.node.callspec.params.get("tiles") == "dot":
        request.getfixturevalue("dot_scores_forced")


def tol_for(tiles) -> float:
    return BF16_TOL if tiles in BF16_PATHS else TILES_TOL if tiles else TOL


def reference_qk(q: torch.Tensor, k: torch.Tensor, tiles) -> tuple[torch.Tensor, torch.Tensor]:
    """q and k as the kernel multiplies them: bf16-rounded at bf16 precision."""
    return (q.bfloat16().float(), k.bfloat16().float()) if tiles in BF16_PATHS else (q, k)


def values_for(v: torch.Tensor, tiles: bool) -> torch.Tensor:
    """V as the formats that take tiles write it (the qkv layer's bf16 output): the tile path
    multiplies V's bf16 words and has no term for a remainder below them."""
    return v.bfloat16().float() if tiles else v


def backend_for(cpu_ops, tiles) -> CpuPagedAttentionBackend:
    backend = CpuPagedAttentionBackend(cpu_ops)
    if tiles in (True, "bf16") and not cpu_ops.int4_linear_amx():
        pytest.skip("no AMX tiles on this CPU")
    if tiles and not backend.enable_tiles("q4", "bf16" if tiles in BF16_PATHS else "float32"):
        pytest.skip("no tile or dot path on this CPU")
    return backend


def make_batch(specs, num_slots=4096, seed=0, contiguous=False):
    """specs: (new tokens, seq len) per request; slots scattered over the pool unless `contiguous`."""
    g = torch.Generator().manual_seed(seed)
    perm = torch.arange(num_slots) if contiguous else torch.randperm(num_slots, generator=g)
    rows, used = [], 0
    for _ext, seq in specs:
        rows.append(perm[used : used + seq].clone())
        used += seq
    return pass_of([e for e, _ in specs], [s for _, s in specs], rows)


def pass_of(extend_lens, seq_lens, slot_rows):
    zeros = torch.zeros(sum(extend_lens), dtype=torch.int64)
    return ForwardBatch(zeros, zeros, zeros, extend_lens, seq_lens, slot_rows, torch.zeros(0, dtype=torch.int64))


def random_qkv(t, heads, kv_heads, dim, num_slots=4096, seed=1):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(t, heads, dim, generator=g) * 2,
        torch.randn(num_slots, kv_heads, dim, generator=g),
        torch.randn(num_slots, kv_heads, dim, generator=g),
    )


def run(backend, batch, q, k, v):
    backend.prepare(batch)
    return backend.forward(q, k, v)


def sdpa_reference(batch, q, k, v):
    """Each request alone: float64 SDPA with a bottom-right causal mask."""
    out, start = torch.empty_like(q), 0
    for ext, seq, slots in zip(batch.extend_lens, batch.seq_lens, batch.slot_rows):
        qe = q[start : start + ext].transpose(0, 1).unsqueeze(0).double()
        ke, ve = (c[slots].transpose(0, 1).unsqueeze(0).double() for c in (k, v))
        mask = torch.arange(seq).unsqueeze(0) <= torch.arange(seq - ext, seq).unsqueeze(1)
        o = F.scaled_dot_product_attention(qe, ke, ve, attn_mask=mask, enable_gqa=True)
        out[start : start + ext] = o[0].transpose(0, 1).float()
        start += ext
    return out


MIXED = [(1, 1), (1, 37), (5, 40), (1, 300), (17, 17), (80, 200), (3, 64), (1, 65), (33, 33), (65, 129)]
# With tiles on, rows that see more than the kernel's tiles_min_keys() (512) keys take them; the
# rest stay on the vector path. These see more, or cross it within their extend (40 rows, 491-530).
LONG = [(1, 521), (1, 513), (80, 640), (33, 560), (40, 530)]  # 3,650 slots with MIXED, of 4,096


def mixed_for(tiles: bool):
    return MIXED + LONG if tiles else MIXED


def rows_seeing(batch, more_than: int) -> torch.Tensor:
    """A mask over the pass's rows: those that see more than `more_than` keys."""
    n = [seq - ext + 1 + i for ext, seq in zip(batch.extend_lens, batch.seq_lens) for i in range(ext)]
    return torch.tensor(n) > more_than


@pytest.mark.parametrize("tiles", TILES)
@pytest.mark.parametrize(
    "heads,kv_heads,dim", [(9, 3, 64), (4, 4, 16), (8, 2, 24), (6, 2, 128), (4, 1, 40), (4, 2, 32)]
)
def test_equals_sdpa_on_a_mixed_batch(cpu_ops, heads, kv_heads, dim, tiles):
    batch = make_batch(mixed_for(tiles))
    q, k, v = random_qkv(batch.num_tokens, heads, kv_heads, dim)
    v = values_for(v, tiles)
    out = run(backend_for(cpu_ops, tiles), batch, q, k, v)
    tol = tol_for(tiles)
    assert (out - sdpa_reference(batch, q, k, v)).abs().max().item() <= tol
    assert (out - run(TorchAttentionBackend(), batch, q, k, v)).abs().max().item() <= tol
    if tiles in BF16_PATHS and dim % 32 == 0:  # the tile rows: the rounded q and k's attention
        tile_rows = rows_seeing(batch, cpu_ops.tiles_min_keys())
        rounded = sdpa_reference(batch, *reference_qk(q, k, tiles), v)
        assert (out - rounded)[tile_rows].abs().max().item() <= TILES_TOL
    if tiles:  # other bits than the vector path's where a row sees enough keys and head_dim allows
        vector = run(CpuPagedAttentionBackend(cpu_ops), batch, q, k, v)
        long = rows_seeing(batch, cpu_ops.tiles_min_keys())
        assert 0 < long.sum() < long.numel()
        assert torch.equal(out[~long], vector[~long])
        assert torch.equal(out[long], vector[long]) == (dim % 32 != 0)


def test_reads_the_pool_in_place_and_takes_a_strided_q(cpu_ops):
    """q as the model makes it (a view into the fused QKV output); contiguous slots."""
    batch = make_batch([(4, 50), (1, 9)], contiguous=True)
    _, k, v = random_qkv(0, 9, 3, 64)
    qkv = torch.randn(batch.num_tokens, (9 + 6) * 64)
    q = qkv[:, : 9 * 64].view(-1, 9, 64)
    out = run(CpuPagedAttentionBackend(cpu_ops), batch, q, k, v)
    assert (out - sdpa_reference(batch, q, k, v)).abs().max().item() <= TOL


def head_major(cache: torch.Tensor) -> torch.Tensor:
    """The same [slot, head, dim] values in KVPool's head-major layout (a transposed view)."""
    return cache.transpose(0, 1).contiguous().transpose(0, 1)


@pytest.mark.parametrize("tiles", TILES)
def test_a_head_major_pool_gives_the_same_bits(cpu_ops, tiles):
    """The layout only moves where a slot's K/V live; every row's arithmetic stays as it was,
    grouped or not. A pool whose K and V are laid out differently is refused, not misread."""
    batch = make_batch(MIXED + [(1, 700), (1, 700)])
    batch.prefix_groups = [PrefixGroup(640, [10, 11])]
    batch.slot_rows[11][:640] = batch.slot_rows[10][:640]
    q, k, v = random_qkv(batch.num_tokens, 9, 3, 64)
    v = values_for(v, tiles)
    backend = backend_for(cpu_ops, tiles)
    hk, hv = head_major(k), head_major(v)
    assert hk.stride() != k.stride() and torch.equal(hk, k)
    assert torch.equal(run(backend, batch, q, hk, hv), run(backend, batch, q, k, v))
    with pytest.raises(RuntimeError, match="K and V alike"):
        run(backend, batch, q, hk, v)


@pytest.mark.parametrize("tiles", TILES)
@pytest.mark.parametrize("heads,kv_heads,dim", [(9, 3, 64), (8, 2, 24), (4, 1, 40)])
def test_bf16_output_is_the_float32_output_rounded(cpu_ops, heads, kv_heads, dim, tiles):
    """forward_as(bfloat16), the model's fused path: written as bf16 by the kernel, the same bits as
    float32 output then .to(bfloat16), head_dim tails included; other dtypes convert after."""
    batch = make_batch(mixed_for(tiles))
    q, k, v = random_qkv(batch.num_tokens, heads, kv_heads, dim)
    v = values_for(v, tiles)
    backend = backend_for(cpu_ops, tiles)
    backend.prepare(batch)
    out = backend.forward_as(q, k, v, torch.bfloat16)
    assert out.dtype == torch.bfloat16 and out.is_contiguous()
    assert torch.equal(out, backend.forward(q, k, v).to(torch.bfloat16))
    assert torch.equal(backend.forward_as(q, k, v, torch.float16), backend.forward(q, k, v).half())


def rows_of(out, batch, request):
    start = sum(batch.extend_lens[:request])
    return out[start : start + batch.extend_lens[request]]


@pytest.mark.parametrize("tiles", TILES)
def test_a_row_is_bitwise_the_same_alone_in_a_batch_and_inside_an_extend(cpu_ops, tiles):
    heads, kv_heads, dim = 9, 3, 64
    _, k, v = random_qkv(0, heads, kv_heads, dim)
    v = values_for(v, tiles)
    g = torch.Generator().manual_seed(7)
    total = 700  # past tiles_min_keys (512): with tiles on, rows of both paths, and extends crossing it
    slots = torch.randperm(4096, generator=g)[:total]
    q_all = torch.randn(total, heads, dim, generator=g)
    backend = backend_for(cpu_ops, tiles)
    # the whole sequence as one prefill: row i sees i + 1 keys
    full = run(backend, pass_of([total], [total], [slots]), q_all, k, v)
    others = make_batch([(1, 500), (40, 90), (3, 3), (2, 800)], seed=3)
    for prefix, ext_len in [
        (699, 1),
        (100, 50),
        (0, 700),
        (120, 5),
        (31, 2),
        (63, 65),
        (480, 60),
        (511, 1),
        (512, 1),
        (600, 37),
    ]:
        rows = slots[: prefix + ext_len]
        alone = pass_of([ext_len], [prefix + ext_len], [rows])
        q = q_all[prefix : prefix + ext_len]
        out_alone = run(backend, alone, q, k, v)
        assert torch.equal(out_alone, full[prefix : prefix + ext_len]), (prefix, ext_len)
        # the same rows among others, in the middle of q
        mixed = pass_of(
            [others.extend_lens[0], ext_len, *others.extend_lens[1:]],
            [others.seq_lens[0], prefix + ext_len, *others.seq_lens[1:]],
            [others.slot_rows[0], rows, *others.slot_rows[1:]],
        )
        q_mixed = torch.cat([torch.randn(1, heads, dim), q, torch.randn(others.num_tokens - 1, heads, dim)])
        assert torch.equal(rows_of(run(backend, mixed, q_mixed, k, v), mixed, 1), out_alone), (prefix, ext_len)


@pytest.mark.parametrize("tiles", TILES)
def test_the_thread_count_changes_nothing(cpu_ops, tiles):
    batch = make_batch(mixed_for(tiles))
    q, k, v = random_qkv(batch.num_tokens, 9, 3, 64)
    before = torch.get_num_threads()
    try:
        outs = []
        for threads in (1, 2, before):
            torch.set_num_threads(threads)
            outs.append(run(backend_for(cpu_ops, tiles), batch, q, k, v))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


def grouped_specs(a_len: int, b_len: int):
    a, b = ("A", a_len, True), ("B", b_len, False)
    return [
        (a, 12, 1),
        (a, 3, 1),
        (a, 20, 5),
        (None, 30, 1),
        (b, 7, 1),
        (b, 15, 1),
        (b, 1, 1),
        (a, 90, 65),
        (None, 100, 100),
        (a, 0, 1),
    ] + [(a, i, 1) for i in range(40)]  # A: more than one tile


# With tiles, A's rows all see more than 512 keys (the AMX path), and B's members fall either side
# (508, 516, 502 keys: a member on the vector path leaves the group, which changes no bit either)
GROUPED = {False: grouped_specs(70, 45), True: grouped_specs(600, 500)}
GROUPED["bf16"] = GROUPED["dot"] = GROUPED[True]


@pytest.mark.parametrize("tiles", TILES)
@pytest.mark.parametrize("heads,kv_heads,dim", [(9, 3, 64), (8, 2, 24)])
def test_prefix_groups_change_no_bit(cpu_ops, heads, kv_heads, dim, tiles):
    from runtime.attention.cascade import find_prefix_groups
    from tests.runtime.attention.test_cascade_attention import make_batch as make_shared_batch

    batch = make_shared_batch(GROUPED[tiles])
    q, k, v = random_qkv(batch.num_tokens, heads, kv_heads, dim)
    v = values_for(v, tiles)
    plain = run(backend_for(cpu_ops, tiles), batch, q, k, v)
    batch.prefix_groups = find_prefix_groups(
        batch.extend_lens,
        batch.seq_lens,
        batch.slot_rows,
        CpuPagedAttentionBackend.max_short_extend,
        min_shared=16,
        min_saved=0,
    )
    assert sorted(len(g.members) for g in batch.prefix_groups) == [3, 45]  # A: a 65-token extend too
    grouped = run(backend_for(cpu_ops, tiles), batch, q, k, v)
    assert torch.equal(grouped, plain)
    assert (grouped - sdpa_reference(batch, q, k, v)).abs().max().item() <= tol_for(tiles)


def test_tiles_only_for_formats_with_bf16_activations_and_only_with_amx_or_bf16_dot(cpu_ops):
    for fmt in ("fp32", "float16"):
        backend = CpuPagedAttentionBackend(cpu_ops)
        assert not backend.enable_tiles(fmt) and backend.name == "cpu" and not backend.tiles
        assert not CpuPagedAttentionBackend(cpu_ops).enable_tiles(fmt, "bf16")
    amx = bool(cpu_ops.int4_linear_amx())
    dot = not amx and bool(cpu_ops.paged_attention_bf16_dot())  # bf16 precision only: float32 is the vector path
    for fmt in ("q4", "q8", "bf16"):
        backend = CpuPagedAttentionBackend(cpu_ops)
        assert backend.enable_tiles(fmt) == amx and backend.name == ("cpu-amx" if amx else "cpu")
        assert not backend.bf16_products
        backend = CpuPagedAttentionBackend(cpu_ops)
        assert backend.enable_tiles(fmt, "bf16") == (amx or dot) and backend.bf16_products == (amx or dot)
        assert backend.name == ("cpu-amx-bf16" if amx else "cpu-bf16-dot" if dot else "cpu")
    assert not TorchAttentionBackend().enable_tiles("q4")
    with pytest.raises(ValueError, match="attention precision 'fp16'"):
        CpuPagedAttentionBackend(cpu_ops).enable_tiles("q4", "fp16")


@pytest.mark.parametrize("tiles", BF16_PATHS)
def test_bf16_precision_takes_effect_on_the_tile_rows_only(cpu_ops, tiles):
    """At bf16 precision the rows that take tiles (or dot scores) get other bits than at float32
    precision (nearer SDPA over the bf16-rounded q and k than over the float32 ones), and the rows
    on the vector path the same bits."""
    batch = make_batch(MIXED + LONG)
    q, k, v = random_qkv(batch.num_tokens, 9, 3, 64)
    v = values_for(v, True)
    out = run(backend_for(cpu_ops, tiles), batch, q, k, v)
    long = rows_seeing(batch, cpu_ops.tiles_min_keys())
    rounded = (out - sdpa_reference(batch, *reference_qk(q, k, tiles), v))[long].abs().max().item()
    plain = (out - sdpa_reference(batch, q, k, v))[long].abs().max().item()
    assert rounded <= TILES_TOL < plain <= BF16_TOL
    # float32 precision: AMX tiles, or without AMX (the dot case) the vector path itself
    f32 = run(backend_for(cpu_ops, True) if tiles == "bf16" else CpuPagedAttentionBackend(cpu_ops), batch, q, k, v)
    assert torch.equal(out[~long], f32[~long]) and not torch.equal(out[long], f32[long])
    assert (out[long] - f32[long]).abs().max().item() <= BF16_TOL


def test_checks_its_inputs(cpu_ops):
    batch = make_batch([(2, 10)])
    q, k, v = random_qkv(2, 4, 2, 16)
    backend = CpuPagedAttentionBackend(cpu_ops)
    backend.prepare(batch)
    with pytest.raises(RuntimeError, match="GQA"):
        backend.forward(q[:, :3], k, v)
    big = torch.zeros(2, 2, 272)
    with pytest.raises(RuntimeError, match="head_dim"):
        backend.forward(big, torch.zeros(4096, 2, 272), torch.zeros(4096, 2, 272))
    backend.meta[0, 4:] = torch.tensor([0, 9])  # a "shared" prefix that is not all cached
    with pytest.raises(RuntimeError, match="must be cached"):
        backend.forward(q, k, v)
    backend.meta[0, 2] = 5000  # a row past the slot table
    with pytest.raises(RuntimeError, match="out of range"):
        backend.forward(q, k, v)


def test_non_float32_passes_go_through_torch(cpu_ops):
    batch = make_batch([(3, 20), (1, 7)])
    q, k, v = random_qkv(batch.num_tokens, 4, 2, 16)
    out = run(CpuPagedAttentionBackend(cpu_ops), batch, q.bfloat16(), k.bfloat16(), v.bfloat16())
    torch.testing.assert_close(out, run(TorchAttentionBackend(), batch, q.bfloat16(), k.bfloat16(), v.bfloat16()))


def test_auto_picks_it_on_cpu_and_falls_back_to_torch(cpu_ops, monkeypatch, caplog, tmp_path):
    assert make_attention_backend("auto", CPU).name == "cpu"
    assert make_attention_backend("cpu", CPU).name == "cpu"
    assert make_attention_backend("torch", CPU).name == "torch"
    with pytest.raises(ValueError, match="CPU only"):
        make_attention_backend("cpu", torch.device("cuda"))
    from torch.utils import cpp_extension

    import runtime.cpu_kernels as cpu_kernels

    def broken(**_kw):
        raise RuntimeError("Error building extension 'x'\nmore lines")

    monkeypatch.setattr(cpp_extension, "load", broken)
    monkeypatch.setattr(cpu_kernels, "loaded", {})
    monkeypatch.setattr(cpu_kernels, "build_dir", lambda: tmp_path / "ext")  # nothing built there yet
    with caplog.at_level(logging.WARNING, logger="jumpgate.attention"):
        assert make_attention_backend("auto", CPU).name == "torch"
        assert make_attention_backend("cpu", CPU).name == "torch"
    assert len(caplog.records) == 1 and "using the torch backend" in caplog.records[0].getMessage()


def test_a_lock_left_by_a_killed_build_does_not_stall_the_next_start(cpu_ops):
    """cpp_extension waits forever on the `lock` file a killed build leaves; a built kernel is
    loaded without it, and a rebuild first clears it under Jumpgate's own flock."""
    import subprocess
    import sys

    import runtime.cpu_kernels as cpu_kernels

    (cpu_kernels.build_dir() / "lock").touch()
    code = "from runtime.cpu_kernels import load_cpu_kernels; assert load_cpu_kernels() is not None"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_engine_greedy_tokens_equal_torch_backend(cpu_ops, tiny_model_dir):
    """Chunked prefill after a cached prefix, jump-free batched decode; same tokens as torch."""
    from runtime.api import GenerateRequest
    from runtime.decode.sampling import SamplingParams
    from runtime.engine.engine import Engine

    g = torch.Generator().manual_seed(5)
    shared = torch.randint(100, 40000, (24,), generator=g).tolist()
    prompts = [shared + torch.randint(100, 40000, (n,), generator=g).tolist() for n in (14, 3)]
    prompts.append(torch.randint(100, 40000, (9,), generator=g).tolist())
    greedy = SamplingParams(max_new_tokens=6, temperature=0.0, ignore_eos=True)
    outs = {}
    for backend in ("torch", "cpu"):
        engine = Engine(
            model=str(tiny_model_dir),
            device="cpu",
            dtype="float32",
            attention_backend=backend,
            kv_pool_tokens=512,
            chunked_prefill_tokens=16,
            max_running_requests=4,
            debug_invariants=True,
        )
        assert engine.runner.attn.name == backend and engine.info.attention_backend == backend
        try:
            first = engine.generate(prompts[0], greedy)
            rest = engine.generate_many([GenerateRequest(p, greedy) for p in prompts[1:]])
        finally:
            engine.shutdown()
        assert rest[0].cached_tokens >= len(shared)
        outs[backend] = [first.token_ids] + [r.token_ids for r in rest]
    assert outs["cpu"] == outs["torch"]
