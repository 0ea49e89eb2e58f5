"""The CUDA path at model level, checked on CPU under the Triton interpreter (on CUDA on a GPU machine):
the CUDA-graph decode runner's static buffers and padding equal an eager pass (captured on GPU), and
the engine gives the same greedy tokens with `attention_backend="triton"` as with torch."""

from __future__ import annotations

import pytest
import torch

from runtime.attention import TorchAttentionBackend
from runtime.forward_batch import ForwardBatch
from tests.runtime.attention.triton_helpers import DEV, ON_GPU, tiny_model

# whole engines through the Triton interpreter on CPU (minutes): the second tier, `make test-slow`
pytestmark = pytest.mark.slow

# ------------------------------------------------------------------------------------------ model level


def test_decode_graph_buffers_and_padding_match_eager(kernels):
    """The CUDA-graph runner's static-buffer pass (eager on CPU, captured graphs on a GPU): batch 3
    padded to 4, then batch 2 in the same graph, whose stale third row must write only scratch."""
    model, kv = tiny_model()
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

    model, kv = tiny_model()
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

    def output_verdict(self, room: int | None = None) -> int | None:
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
