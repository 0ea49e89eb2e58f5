"""The CUDA path's kernels, checked on CPU under the Triton interpreter at tiny sizes (compiled on CUDA
tensors on a GPU machine): extend + split-K decode attention and shared-prefix (cascade) decode equal
`TorchAttentionBackend`; the bitmask kernel equals the torch mask; backend selection; and
`bench/device_check.sh --smoke` runs, and the bf16 kernels compile for sm_90 (no GPU needed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench.harness.device_cases import attention_case
from runtime.attention import TorchAttentionBackend, make_attention_backend
from runtime.decode.sampler import apply_bitmask_, apply_token_bitmask
from tests.runtime.attention.triton_helpers import CPU, DEV, ON_GPU, tiny_model

ROOT = Path(__file__).resolve().parents[3]
FP32_TOL = 1e-4 if ON_GPU else 1e-5


# ------------------------------------------------------------------------------------------ attention

# (seq_len, extend_len): plain prefill, decodes (one reaches 4 splits with an empty last one),
# extends after a cached prefix, a 1-token request.
SPECS = [(20, 20), (37, 1), (45, 13), (1, 1), (70, 1), (9, 3)]


@pytest.mark.parametrize(
    "dtype,heads,kv_heads,dim,atol",
    [
        (torch.float32, 4, 4, 16, FP32_TOL),
        (torch.float32, 4, 2, 24, FP32_TOL),  # head_dim 24: padded to a 32-wide tile
        (torch.float32, 8, 2, 16, FP32_TOL),
        (torch.float16, 8, 2, 16, 2e-3),
        (torch.bfloat16, 4, 2, 16, 2e-2),
    ],
)
def test_attention_matches_torch_backend(kernels, dtype, heads, kv_heads, dim, atol):
    q, k, v, batch = attention_case(SPECS, heads, kv_heads, dim, dtype, DEV, slots=200, seed=heads + dim)
    ref = TorchAttentionBackend()
    ref.prepare(batch)
    want = ref.forward(q, k, v).float()
    for splits in (1, 4):
        tri = kernels.attn.TritonAttentionBackend(max_kv_splits=splits, min_split_tokens=16, extend_blocks=(16, 16))
        tri.prepare(batch)
        got = tri.forward(q, k, v)
        assert got.dtype == dtype
        torch.testing.assert_close(got.float(), want, atol=atol, rtol=0, msg=f"kv splits {splits}")


def test_decode_only_and_extend_only_batches(kernels):
    for specs in ([(5, 1), (33, 1), (2, 1)], [(12, 12), (30, 7)]):
        q, k, v, batch = attention_case(specs, 4, 2, 16, torch.float32, DEV, slots=100, seed=3)
        ref = TorchAttentionBackend()
        ref.prepare(batch)
        tri = kernels.attn.TritonAttentionBackend(max_kv_splits=2, min_split_tokens=8)
        tri.prepare(batch)
        assert (tri.extend is None) == all(e == 1 for e in batch.extend_lens)
        assert (tri.decode is None) == all(e > 1 for e in batch.extend_lens)
        torch.testing.assert_close(tri.forward(q, k, v), ref.forward(q, k, v), atol=FP32_TOL, rtol=0)


def test_split_counts(kernels):
    ta = kernels.attn
    seq = torch.tensor([1, 16, 17, 300], dtype=torch.int32)
    assert ta.num_kv_splits(seq, 4, 16).tolist() == [1, 1, 2, 4]
    assert ta.default_max_splits(64, 8, CPU) >= 1
    per_prog, blocks, block_h = ta.decode_head_blocks(32, 8)
    assert (per_prog, blocks, block_h) == (4, 8, 16)
    with pytest.raises(ValueError, match="multiple"):
        ta.decode_head_blocks(6, 4)


# ------------------------------------------------------------------------------- shared prefix (cascade)

# (shared prefix, private positions, new tokens) per request, as tests/runtime/attention/test_cascade_attention.py
# builds them: group A of 20 decodes (two prefix tasks when 16 fit one: 4 query heads per KV head),
# a draft and a prompt chunk after A's prefix (extends: never in a Triton group), group B over
# scattered slots with one member holding no private past, private decodes and a fresh prefill.
_A, _B, _C = ("A", 70, True), ("B", 45, False), ("C", 33, True)
CASCADE_MIXED = (
    [(_A, 3 + 2 * i, 1) for i in range(20)]
    + [(_A, 20, 5), (_A, 90, 80)]
    + [(None, 30, 1), (None, 9, 4)]
    + [(_B, 7, 1), (_B, 15, 1), (_B, 1, 1)]
    + [(_C, 4, 1), (None, 100, 100)]
)


def _cascade_case(dtype, heads, kv_heads, dim, seed):
    from tests.runtime.attention.test_cascade_attention import make_batch, random_qkv

    batch = make_batch(CASCADE_MIXED, seed=seed)
    q, k, v = (x.to(device=DEV, dtype=dtype) for x in random_qkv(batch, heads, kv_heads, dim, seed=seed))
    batch.input_ids = batch.input_ids.to(DEV)
    return batch, q, k, v


@pytest.mark.slow  # the Triton interpreter: the second tier (make test-slow)
@pytest.mark.parametrize(
    "dtype,heads,kv_heads,dim,atol",
    [
        (torch.float32, 8, 2, 16, FP32_TOL),
        (torch.float32, 9, 3, 24, FP32_TOL),
        (torch.bfloat16, 4, 4, 16, 2e-2),
    ],
)
def test_shared_prefix_decode_equals_plain_attention(kernels, dtype, heads, kv_heads, dim, atol):
    from runtime.attention.cascade import find_prefix_groups

    batch, q, k, v = _cascade_case(dtype, heads, kv_heads, dim, seed=heads)
    ref = TorchAttentionBackend()
    ref.prepare(batch)  # no groups: every request over its whole row
    want = ref.forward(q, k, v).float()
    ta = kernels.attn
    batch.prefix_groups = find_prefix_groups(
        batch.extend_lens,
        batch.seq_lens,
        batch.slot_rows,
        ta.TritonAttentionBackend.max_short_extend,
        min_shared=16,
        min_saved=0,
    )
    assert sorted((len(g.members), g.shared_len) for g in batch.prefix_groups) == [(3, 45), (20, 70)]
    members = 64 // (heads // kv_heads)
    for splits in (1, 4):
        tri = ta.TritonAttentionBackend(max_kv_splits=splits, min_split_tokens=16)
        tri.prepare(batch)
        got = tri.forward(q, k, v)
        d = tri.decode
        assert d.prefix is not None and d.prefix.members.shape[0] == 1 + (20 > members) + 1
        assert int((d.kv_start > 0).sum()) == 23 and int(d.prefix.num_splits.max()) == min(splits, 5)
        torch.testing.assert_close(got.float(), want, atol=atol, rtol=0, msg=f"kv splits {splits}")


def test_shared_prefix_groups_given_by_hand(kernels):
    """A group shorter than the common prefix, a group holding an extend (which the extend kernel
    takes whole) and one decode (no task: nothing to share), next to a plain decode batch."""
    from runtime.forward_batch import PrefixGroup

    batch, q, k, v = _cascade_case(torch.float32, 6, 2, 32, seed=5)
    ref = TorchAttentionBackend()
    ref.prepare(batch)
    want = ref.forward(q, k, v)
    batch.prefix_groups = [PrefixGroup(40, list(range(10)) + [20]), PrefixGroup(45, [24, 21])]
    tri = kernels.attn.TritonAttentionBackend(max_kv_splits=2, min_split_tokens=16)
    tri.prepare(batch)
    torch.testing.assert_close(tri.forward(q, k, v), want, atol=FP32_TOL, rtol=0)
    assert tri.groups == [(40, list(range(10)))]  # the extend (20) and the lone decode left out
    assert tri.decode.kv_start.tolist()[:11] == [40] * 10 + [0]


# ------------------------------------------------------------------------------------------ bitmask


def _random_mask(b: int, vocab: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-(2**31), 2**31 - 1, (b, (vocab + 31) // 32), generator=g, dtype=torch.int64).to(torch.int32)


@pytest.mark.parametrize("words", [False, True], ids=["lane-words", "unpacked-words"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bitmask_kernel_matches_torch(kernels, dtype, words):
    b, vocab = 5, 1000  # not a multiple of 32, nor of the kernel's block
    logits = torch.randn(b, vocab, generator=torch.Generator().manual_seed(1)).to(device=DEV, dtype=dtype)
    mask = _random_mask(b, vocab, 2).to(DEV)
    for rows in (torch.tensor([0, 3, 4], device=DEV), None):
        want, got = logits.clone(), logits.clone()
        apply_bitmask_(want, mask, rows)
        kernels.bitmask.apply_token_bitmask_triton(got, mask, rows, block=256, words=words)
        assert torch.equal(got, want)


def test_apply_token_bitmask_on_cpu_uses_torch_and_only_the_given_rows():
    b, vocab = 4, 70
    logits = torch.randn(b, vocab)
    mask = _random_mask(b, vocab, 3)
    out = logits.clone()
    apply_token_bitmask(out, mask, torch.tensor([1, 2]))
    assert torch.equal(out[0], logits[0]) and torch.equal(out[3], logits[3])
    for r in (1, 2):
        allowed = [bool((int(mask[r, t // 32]) >> (t % 32)) & 1) for t in range(vocab)]
        assert [not torch.isinf(x).item() for x in out[r]] == allowed
    full = logits.clone()
    apply_token_bitmask(full, torch.full((b, 3), -1, dtype=torch.int32))  # all allowed: unchanged
    assert torch.equal(full, logits)
    with pytest.raises(ValueError, match="covering"):
        apply_token_bitmask(logits, torch.zeros(b, 2, dtype=torch.int32))
    with pytest.raises(ValueError, match="must be"):
        apply_token_bitmask(logits, torch.zeros(b + 1, 3, dtype=torch.int32))


# ------------------------------------------------------------------------------------------ selection


def test_backend_selection(monkeypatch, kernels):
    from runtime.cpu_kernels import load_cpu_kernels

    assert make_attention_backend("auto", CPU).name == ("cpu" if load_cpu_kernels() else "torch")
    assert make_attention_backend("torch", CPU).name == "torch"
    assert make_attention_backend("auto", torch.device("cuda")).name == "triton"  # builds nothing on CUDA yet
    with pytest.raises(ValueError, match="attention_backend"):
        make_attention_backend("flash", CPU)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert make_attention_backend("triton", CPU).name == "triton"
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="CUDA"):
        make_attention_backend("triton", CPU)
    model, kv = tiny_model(CPU)
    with pytest.raises(ValueError, match="CUDA"):
        kernels.graphs.DecodeCudaGraphs(model, kv, 4, 64)  # capture needs a GPU


def test_cli_flags_map_to_engine_config():
    from gateway.cli import build_parser, serve_settings

    cfg = serve_settings(build_parser().parse_args(["serve"]), environ={}).engine
    assert cfg.attention_backend == "auto" and cfg.cuda_graphs is True
    argv = ["serve", "--attention-backend", "triton", "--no-cuda-graphs"]
    cfg = serve_settings(build_parser().parse_args(argv), environ={}).engine
    assert cfg.attention_backend == "triton" and cfg.cuda_graphs is False


# ------------------------------------------------------------------------------------------ scripts


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(PYTHONPATH=str(ROOT), TRITON_DEFAULT_FP_FUSION="1", **extra)
    return env


@pytest.mark.slow
def test_device_check_smoke_runs_on_cpu(smollm_dir):
    proc = subprocess.run(
        ["bash", str(ROOT / "bench" / "device_check.sh"), "--smoke", "--tokenizer-dir", str(smollm_dir)],
        cwd=ROOT,
        env=_env(PYTHON=sys.executable),
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = next(r for r in lines if r.get("section") == "summary")
    assert summary["ok"], summary
    seen = {r.get("section") or r.get("check") for r in lines}
    assert {
        "attention",
        "bitmask",
        "bitmask_sweep",
        "cuda_graph_decode",
        "model",
        "decode_attention",
        "imports",
    } <= seen
    assert any(r.get("batch") == 3 and r.get("check") == "cuda_graph_decode" for r in lines)  # padded 3 -> 4
    assert all(r["ok"] for r in lines if r.get("section") == "bitmask_sweep" and "ok" in r)
    # the whole engine: Triton backend == torch backend greedy, then the per-backend bench and profile
    engine = {r.get("section") or r.get("check"): r for r in lines}
    assert engine["engine_greedy_equal"]["ok"] and engine["engine_greedy_equal"]["cached_tokens_triton"] > 0
    assert engine["engine_summary"]["ok"], engine["engine_summary"]
    assert engine["engine_profile"]["top_by_own_time"]


@pytest.mark.slow
def test_kernels_compile_for_sm90():
    """Ahead-of-time compile (triton ships ptxas): catches GPU-only compile errors here."""
    proc = subprocess.run(
        [sys.executable, "-m", "bench.probes.device_check", "--aot", "90", "--quick"],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and lines and all(r["ok"] for r in lines), proc.stdout[-3000:] + proc.stderr[-2000:]
    assert {r["kernel"].split()[0] for r in lines} == {"extend", "decode", "prefix", "merge", "bitmask"}
