"""The CUDA path, checked on CPU: Triton kernels run under the Triton interpreter at tiny sizes
(`tests/conftest.py` turns it on before triton is first imported when there is no GPU; on a GPU
machine the same tests run the compiled kernels on CUDA tensors).

- extend + split-K decode attention equal `TorchAttentionBackend` (mixed lengths, cached prefixes,
  GQA 1/2/4, float32/float16/bfloat16, a head_dim that is not a power of two);
- the bitmask kernel equals the torch mask; `apply_token_bitmask` picks torch on CPU;
- the engine gives the same greedy tokens with `attention_backend="triton"` as with torch;
- the CUDA-graph decode runner's static buffers and padding equal an eager pass (captured on GPU);
- `bench/device_check.sh --smoke` runs, and the bf16 kernels compile for sm_90 (no GPU needed).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from bench.probes.device_check import SMOKE, attention_case, build_model
from runtime.attention import TorchAttentionBackend, make_attention_backend, triton_interpreter_enabled
from runtime.decode.sampler import apply_bitmask_, apply_token_bitmask
from runtime.forward_batch import ForwardBatch
from runtime.kvcache.pool import KVPool

ROOT = Path(__file__).resolve().parents[3]
CPU = torch.device("cpu")
ON_GPU = torch.cuda.is_available() and not triton_interpreter_enabled()
DEV = torch.device("cuda") if ON_GPU else CPU
FP32_TOL = 1e-4 if ON_GPU else 1e-5


@pytest.fixture(scope="module")
def kernels():
    """The kernel modules, imported lazily (only these tests need triton)."""
    if not ON_GPU and not triton_interpreter_enabled():
        pytest.skip("no GPU and TRITON_INTERPRET is off: Triton kernels cannot run here")
    from triton.runtime.interpreter import InterpretedFunction

    from runtime.attention import triton_backend
    from runtime.decode import triton_bitmask
    from runtime.model import cuda_graphs

    interpreted = isinstance(triton_backend.extend_kernel, InterpretedFunction)
    assert interpreted == (not ON_GPU), "kernel modules were imported before TRITON_INTERPRET was set"
    return SimpleNamespace(attn=triton_backend, bitmask=triton_bitmask, graphs=cuda_graphs)


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
    model, kv = _tiny_model(CPU)
    with pytest.raises(ValueError, match="CUDA"):
        kernels.graphs.DecodeCudaGraphs(model, kv, 4, 64)  # capture needs a GPU


def test_cli_flags_map_to_engine_config():
    from gateway.cli import build_parser, serve_settings

    cfg = serve_settings(build_parser().parse_args(["serve"]), environ={}).engine
    assert cfg.attention_backend == "auto" and cfg.cuda_graphs is True
    argv = ["serve", "--attention-backend", "triton", "--no-cuda-graphs"]
    cfg = serve_settings(build_parser().parse_args(argv), environ={}).engine
    assert cfg.attention_backend == "triton" and cfg.cuda_graphs is False


# ------------------------------------------------------------------------------------------ model level


def _tiny_model(device=DEV):
    cfg, model, _ = build_model(SMOKE["model"], device, torch.float32, max_positions=128)
    return model, KVPool(cfg.num_layers, 96, cfg.num_kv_heads, cfg.head_dim, torch.float32, device)


def test_decode_graph_buffers_and_padding_match_eager(kernels):
    """The CUDA-graph runner's static-buffer pass (eager on CPU, captured graphs on a GPU): batch 3
    padded to 4, then batch 2 in the same graph, whose stale third row must write only scratch."""
    model, kv = _tiny_model()
    vocab = model.cfg.vocab_size
    lens = [9, 4, 13]
    slots = [torch.arange(i * 32, i * 32 + 32) for i in range(3)]
    g = torch.Generator().manual_seed(0)
    ids = [torch.randint(0, vocab, (n,), generator=g) for n in lens]
    torch_attn = TorchAttentionBackend()
    # the engine's layout: ids, positions and logits rows on the device; slots on the host
    prefill = ForwardBatch(
        torch.cat(ids).to(DEV),
        torch.cat([torch.arange(n) for n in lens]).to(DEV),
        torch.cat([s[:n] for s, n in zip(slots, lens)]),
        lens,
        lens,
        [s[:n] for s, n in zip(slots, lens)],
        torch.tensor([8, 12, 25], device=DEV),
    )
    model.forward(prefill, kv, torch_attn)
    graphs = kernels.graphs.DecodeCudaGraphs(
        model, kv, 4, 64, batch_sizes=(1, 4), capture=ON_GPU, min_split_tokens=4, max_kv_splits=2
    )

    def decode(rows):
        nxt = torch.randint(0, vocab, (len(rows),), generator=g)
        return ForwardBatch(
            nxt.to(DEV),
            torch.tensor([lens[r] for r in rows], device=DEV),
            torch.stack([slots[r][lens[r]] for r in rows]),
            [1] * len(rows),
            [lens[r] + 1 for r in rows],
            [slots[r][: lens[r] + 1] for r in rows],
            torch.arange(len(rows), device=DEV),
        )

    for rows in ([0, 1, 2], [1, 2]):
        batch = decode(rows)
        assert graphs.can_run(batch)
        before = [t.clone() for t in kv.k + kv.v]
        got = graphs.run(batch).clone()
        after_graph = [t.clone() for t in kv.k + kv.v]
        for t, b in zip(kv.k + kv.v, before):
            t.copy_(b)
        want = model.forward(batch, kv, torch_attn)
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
        for mine, eager in zip(after_graph, kv.k + kv.v):  # the same K/V in real slots; padding only in scratch
            torch.testing.assert_close(mine[:-1], eager[:-1], atol=1e-6, rtol=0)
            assert mine[kv.scratch_slot].abs().sum() > 0
        for r in rows:
            lens[r] += 1
    extend = ForwardBatch(
        torch.tensor([1, 2]),
        torch.tensor([lens[0], lens[0] + 1]),
        slots[0][lens[0] : lens[0] + 2],
        [2],
        [lens[0] + 2],
        [slots[0][: lens[0] + 2]],
        torch.tensor([1]),
    )
    assert not graphs.can_run(extend)  # extend passes run eagerly


def test_decode_graph_with_shared_prefix_groups_matches_eager(kernels):
    """Decode steps whose requests share a cached prefix replay the graph with the prefix kernel
    (eager on CPU): three requests over one 20-token prefix next to a private one, then two of
    them in the same padded graph (the third's task and start must not linger), then a step with
    no group (the graph without the prefix kernel)."""
    from runtime.attention.cascade import find_prefix_groups

    model, kv = _tiny_model()
    vocab = model.cfg.vocab_size
    g = torch.Generator().manual_seed(1)
    prefix = torch.arange(0, 20)
    own = [torch.arange(20 + 12 * i, 32 + 12 * i) for i in range(4)]  # 12 private slots each
    rows = [torch.cat([prefix, own[i]]) for i in range(3)] + [own[3]]
    lens = [23, 25, 21, 9]  # positions written so far (request 3 has no shared part)
    torch_attn = TorchAttentionBackend()
    for r in range(4):  # prefill: the first request writes the prefix, the others extend after it
        start = 0 if r in (0, 3) else 20
        n = lens[r] - start
        model.forward(
            ForwardBatch(
                torch.randint(0, vocab, (n,), generator=g).to(DEV),
                torch.arange(start, lens[r]).to(DEV),
                rows[r][start : lens[r]],
                [n],
                [lens[r]],
                [rows[r][: lens[r]]],
                torch.tensor([n - 1], device=DEV),
            ),
            kv,
            torch_attn,
        )
    graphs = kernels.graphs.DecodeCudaGraphs(
        model, kv, 4, 64, batch_sizes=(1, 4), capture=ON_GPU, min_split_tokens=4, max_kv_splits=2
    )

    def decode(reqs):
        nxt = torch.randint(0, vocab, (len(reqs),), generator=g)
        batch = ForwardBatch(
            nxt.to(DEV),
            torch.tensor([lens[r] for r in reqs], device=DEV),
            torch.stack([rows[r][lens[r]] for r in reqs]),
            [1] * len(reqs),
            [lens[r] + 1 for r in reqs],
            [rows[r][: lens[r] + 1] for r in reqs],
            torch.arange(len(reqs), device=DEV),
        )
        batch.prefix_groups = find_prefix_groups(
            batch.extend_lens, batch.seq_lens, batch.slot_rows, 1, min_shared=8, min_saved=0
        )
        return batch

    for reqs, members in (([0, 3, 1, 2], [0, 2, 3]), ([2, 0], [0, 1]), ([3], None)):
        batch = decode(reqs)
        assert [gr.members for gr in batch.prefix_groups] == ([members] if members else [])
        assert graphs.can_run(batch)
        before = [t.clone() for t in kv.k + kv.v]
        got = graphs.run(batch).clone()
        for t, b in zip(kv.k + kv.v, before):
            t.copy_(b)
        want = model.forward(batch, kv, torch_attn)
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
        if members:
            assert int(graphs.kv_start[: len(reqs)].count_nonzero()) == len(members)
        for r in reqs:
            lens[r] += 1


class _ThreeTokens:
    """A toy grammar for the engine test: step i allows exactly the tokens in `allowed(i)`."""

    @staticmethod
    def allowed(i: int) -> list[int]:
        return [101 + 7 * i, 2003 + i, 39007 - 5 * i]

    def new_matcher(self):
        return self

    def __init__(self):
        self.n = 0

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        bitmask[row] = 0
        for t in self.allowed(self.n):
            word = int(bitmask[row, t // 32]) | (1 << (t % 32))
            bitmask[row, t // 32] = word - (1 << 32) if word >= 1 << 31 else word

    def accept(self, token_id: int) -> bool:
        ok = token_id in self.allowed(self.n)
        self.n += ok
        return ok

    def rollback(self, num_tokens: int) -> None:
        self.n -= num_tokens

    def is_terminated(self) -> bool:
        return False

    def is_completed(self) -> bool:
        return False

    def jump_forward_tokens(self, learn: bool = True) -> list[int]:
        return []

    def valid_prefix(self, token_ids: list[int]) -> int:
        n = 0
        while n < len(token_ids) and token_ids[n] in self.allowed(self.n + n):
            n += 1
        return n

    withholds_output = False

    def output_verdict(self) -> int | None:
        return None


def test_engine_forms_groups_by_the_backends_threshold_and_cascade_keeps_the_tokens(
    kernels, tiny_model_dir, formed_groups
):
    """Three requests decoding together under a cached 70-token prefix: the runner forms groups
    only when they save the backend's min_saved_prefix_reads (either default is too high for this
    step: no group; 0 forms them), and with groups the Triton engine's greedy tokens equal its own
    without and the torch backend's with them."""
    from runtime.api import GenerateRequest
    from runtime.decode.sampling import SamplingParams
    from runtime.engine.engine import Engine

    formed = formed_groups
    g = torch.Generator().manual_seed(9)
    shared = torch.randint(100, 40000, (70,), generator=g).tolist()
    prompts = [shared + torch.randint(100, 40000, (n,), generator=g).tolist() for n in (2, 5, 3)]
    greedy = SamplingParams(max_new_tokens=4, temperature=0.0, ignore_eos=True)
    outs = {}
    for backend, min_saved in (("torch", 0), ("triton", None), ("triton", 0)):
        engine = Engine(
            model=str(tiny_model_dir),
            device=DEV.type,
            dtype="float32",
            attention_backend=backend,
            kv_pool_tokens=512,
            max_running_requests=4,
            debug_invariants=True,
        )
        if min_saved is not None:
            engine.runner.attn.min_saved_prefix_reads = min_saved
        formed.clear()
        try:
            engine.generate(prompts[0], SamplingParams(max_new_tokens=1, temperature=0.0))  # caches the prefix
            outs[backend, min_saved] = [
                r.token_ids for r in engine.generate_many([GenerateRequest(p, greedy) for p in prompts])
            ]
        finally:
            engine.shutdown()
        decode_groups = [gr for gr in formed if len(gr.members) == 3]
        assert bool(decode_groups) == (min_saved == 0), (backend, min_saved)
    assert outs["triton", 0] == outs["triton", None] == outs["torch", 0]


def test_engine_greedy_tokens_equal_torch_backend(kernels, tiny_model_dir):
    """Chunked prefill (extends after cached prefixes), a shared prefix hit, then batched decode
    with one grammar-constrained request among free ones (the mask applies to that row only)."""
    from runtime.api import GenerateRequest
    from runtime.decode.sampling import SamplingParams
    from runtime.engine.engine import Engine

    g = torch.Generator().manual_seed(5)
    shared = torch.randint(100, 40000, (24,), generator=g).tolist()
    prompts = [shared + torch.randint(100, 40000, (n,), generator=g).tolist() for n in (14, 3)]
    prompts.append(torch.randint(100, 40000, (9,), generator=g).tolist())
    outs = {}
    for backend in ("torch", "triton"):
        engine = Engine(
            model=str(tiny_model_dir),
            device=DEV.type,
            dtype="float32",
            attention_backend=backend,
            kv_pool_tokens=512,
            chunked_prefill_tokens=16,
            max_running_requests=4,
            debug_invariants=True,
        )
        assert engine.runner.attn.name == backend
        assert (engine.runner.cuda_graphs is not None) == (ON_GPU and backend == "triton")
        try:
            first = engine.generate(prompts[0], SamplingParams(max_new_tokens=3, temperature=0.0, ignore_eos=True))
            greedy = SamplingParams(max_new_tokens=4, temperature=0.0, ignore_eos=True)
            rest = engine.generate_many(
                [GenerateRequest(prompts[1], greedy, constraint=_ThreeTokens()), GenerateRequest(prompts[2], greedy)]
            )
        finally:
            engine.shutdown()
        assert rest[0].cached_tokens >= len(shared)
        assert all(t in _ThreeTokens.allowed(i) for i, t in enumerate(rest[0].token_ids))
        outs[backend] = [first.token_ids] + [r.token_ids for r in rest]
    assert outs["triton"] == outs["torch"]
    assert outs["torch"][2] != outs["torch"][1]  # the free request was not masked


def test_engine_jump_forward_verify_equals_torch_backend(kernels, tiny_model_dir, tokenizer):
    """Jump-forward drafts verified through the Triton kernels: short extends after cached
    prefixes, next to decodes in the same pass, rejected tails rolled back. Tokens equal the torch
    backend's, and `verify` equals `off` on both (the CUDA path of #4, before a GPU runs it)."""
    from grammar import GrammarService, GrammarSpec
    from runtime.api import GenerateRequest
    from runtime.decode.sampling import SamplingParams
    from runtime.engine.engine import Engine
    from runtime.model.loader import read_config

    spec = GrammarSpec.json_schema(
        {
            "type": "object",
            "additionalProperties": False,
            "required": ["status", "count", "tags"],
            "properties": {
                "status": {"enum": ["accepted_by_reviewer", "rejected_by_reviewer"]},
                "count": {"type": "integer"},
                "tags": {"type": "array", "maxItems": 2, "items": {"type": "string", "maxLength": 4}},
            },
        }
    )
    g = torch.Generator().manual_seed(11)
    shared = torch.randint(100, 40000, (20,), generator=g).tolist()
    prompts = [shared + torch.randint(100, 40000, (n,), generator=g).tolist() for n in (5, 9, 2)]
    outs, counters = {}, {}
    for backend in ("torch", "triton"):
        # a service each: the draft splitter learns the model's splits, and both backends start unlearned
        service = GrammarService(tokenizer, read_config(tiny_model_dir).vocab_size)
        handle = service.compile(spec)
        for mode in ("off", "verify"):
            engine = Engine(
                model=str(tiny_model_dir),
                device=DEV.type,
                dtype="float32",
                attention_backend=backend,
                kv_pool_tokens=1024,
                max_running_requests=4,
                debug_invariants=True,
            )
            try:
                greedy = SamplingParams(max_new_tokens=40, temperature=0.0)
                res = engine.generate_many(
                    [GenerateRequest(p, greedy, constraint=handle, jump_forward=mode) for p in prompts]
                )
                stats = engine.stats()
            finally:
                engine.shutdown()
            assert stats.kv_slots_request_only == 0
            outs[backend, mode] = [r.token_ids for r in res]
            counters[backend, mode] = (stats.jump_forward_tokens, stats.jump_forward_rejected)
        service.close()
    assert outs["triton", "verify"] == outs["torch", "verify"] == outs["torch", "off"] == outs["triton", "off"]
    assert counters["triton", "verify"] == counters["torch", "verify"]
    accepted, rejected = counters["triton", "verify"]
    assert accepted > 0 and rejected > 0  # drafts kept through the extend kernel, and tails rolled back
    assert counters["triton", "off"] == (0, 0)


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
