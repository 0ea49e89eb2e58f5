"""Shared-prefix (cascade) attention equals plain attention.

- find_prefix_groups: who shares what (first-slot buckets, longest common prefix, only cached
  positions, the threshold, long extends left out);
- merge_by_lse of two halves equals attention over both;
- the torch backend with prefix groups equals it without them (fp32, tight tolerance) on mixed
  batches: shared and private decodes, several groups, jump-forward drafts, a chunked prefill next
  to the decodes, contiguous (read in place) and scattered shared slots, GQA 1/3/4;
- `--no-cascade-attention` turns it off;
- the real model gives identical greedy tokens with cascade attention on and off for a batch that
  shares a long cached system prompt (and groups were really formed).
"""

from __future__ import annotations

import pytest
import torch

from runtime.attention import TorchAttentionBackend
from runtime.attention.cascade import attention_with_lse, find_prefix_groups, merge_by_lse
from runtime.forward_batch import ForwardBatch, PrefixGroup

FP32_TOL = 1e-5
CONTIGUOUS_FROM = 3000  # contiguous shared prefixes are placed from here, scattered slots below


def make_batch(specs, seed=0):
    """specs: (shared, private, extend) per request; `shared` names a prefix (None: no shared part)
    given as (key, length, contiguous). Requests naming one key share its slots."""
    g = torch.Generator().manual_seed(seed)
    free = torch.randperm(CONTIGUOUS_FROM, generator=g).tolist()  # scattered slots
    prefixes: dict = {}
    rows = []
    for shared, private, _ext in specs:
        parts = []
        if shared is not None:
            key, length, contiguous = shared
            if key not in prefixes:
                if contiguous:
                    start = CONTIGUOUS_FROM + 200 * len(prefixes)
                    prefixes[key] = torch.arange(start, start + length)
                else:
                    prefixes[key] = torch.tensor([free.pop() for _ in range(length)])
            parts.append(prefixes[key])
        parts.append(torch.tensor([free.pop() for _ in range(private)], dtype=torch.int64))
        rows.append(torch.cat(parts))
    ext_lens = [e for _, _, e in specs]
    t = sum(ext_lens)
    zeros = torch.zeros(t, dtype=torch.int64)
    return ForwardBatch(
        zeros, zeros, zeros, ext_lens, [r.numel() for r in rows], rows, torch.zeros(0, dtype=torch.int64)
    )


def run_backend(batch, q, k, v):
    attn = TorchAttentionBackend()
    attn.prepare(batch)
    return attn.forward(q, k, v)


def random_qkv(batch, heads, kv_heads, dim, slots=4096, seed=1):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch.num_tokens, heads, dim, generator=g)
    k = torch.randn(slots, kv_heads, dim, generator=g)
    v = torch.randn(slots, kv_heads, dim, generator=g)
    return q, k, v


def test_groups_bucket_by_shared_slots_and_stop_at_first_mismatch():
    a, b = ("A", 40, True), ("B", 30, False)
    batch = make_batch([(a, 5, 1), (a, 9, 1), (b, 2, 1), (None, 50, 1), (b, 3, 3), (a, 0, 1)])
    groups = find_prefix_groups(
        batch.extend_lens, batch.seq_lens, batch.slot_rows, max_extend=65, min_shared=8, min_saved=0
    )
    by_members = {tuple(gr.members): gr.shared_len for gr in groups}
    # the last A request has only the prefix: its last slot is its new token, so the group keeps 39
    assert by_members == {(0, 1, 5): 39, (2, 4): 30}


def test_a_request_sharing_only_the_first_slots_does_not_break_a_group():
    """As two chat prompts with different system prompts share the template's first tokens."""
    a = ("A", 40, True)
    batch = make_batch([(a, 5, 1), (a, 9, 1), (a, 2, 1)])
    outlier = torch.cat([batch.slot_rows[0][:3], torch.arange(2000, 2050)])
    rows = [*batch.slot_rows, outlier]
    groups = find_prefix_groups([1, 1, 1, 1], [r.numel() for r in rows], rows, 65, min_shared=8, min_saved=0)
    assert [(gr.members, gr.shared_len) for gr in groups] == [([0, 1, 2], 40)]


def test_groups_need_two_members_a_long_enough_prefix_and_short_extends():
    a = ("A", 40, True)
    batch = make_batch([(a, 5, 1), (None, 45, 1)])
    assert find_prefix_groups(batch.extend_lens, batch.seq_lens, batch.slot_rows, 65, min_shared=8, min_saved=0) == []
    batch = make_batch([(a, 5, 1), (a, 5, 1)])
    assert find_prefix_groups(batch.extend_lens, batch.seq_lens, batch.slot_rows, 65, min_shared=41, min_saved=0) == []
    # a prompt chunk (extend longer than max_extend) is attended on its own
    batch = make_batch([(a, 100, 100), (a, 5, 1), (a, 6, 2)])
    groups = find_prefix_groups(batch.extend_lens, batch.seq_lens, batch.slot_rows, 65, min_shared=8, min_saved=0)
    assert [(gr.members, gr.shared_len) for gr in groups] == [([1, 2], 40)]


def test_groups_form_only_where_they_save_more_prefix_reads_than_their_suffixes_cost():
    a = ("A", 40, True)
    batch = make_batch([(a, 5, 1), (a, 9, 1), (a, 2, 1)])  # saves 80 reads, suffixes hold 16
    find = lambda **kw: find_prefix_groups(batch.extend_lens, batch.seq_lens, batch.slot_rows, 65, min_shared=8, **kw)
    assert [gr.members for gr in find(min_saved=80)] == [[0, 1, 2]]
    assert find(min_saved=81) == []
    batch = make_batch([(a, 50, 1), (a, 40, 1)])  # saves 40 reads, suffixes hold 90
    assert find(min_saved=0) == []


def test_merge_by_lse_equals_attention_over_both_halves():
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 6, 3, 16, generator=g)
    k = torch.randn(2, 2, 50, 16, generator=g)
    v = torch.randn(2, 2, 50, 16, generator=g)
    full = torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    o1, l1 = attention_with_lse(q, k[:, :, :20], v[:, :, :20])
    o2, l2 = attention_with_lse(q, k[:, :, 20:], v[:, :, 20:])
    torch.testing.assert_close(merge_by_lse(o1, l1, o2, l2), full, atol=FP32_TOL, rtol=FP32_TOL)
    torch.testing.assert_close(l1.logaddexp(l2), attention_with_lse(q, k, v)[1], atol=FP32_TOL, rtol=FP32_TOL)


A, B, C = ("A", 70, True), ("B", 45, False), ("C", 33, True)
MIXED = [
    (A, 12, 1),
    (A, 3, 1),
    (A, 20, 5),  # group A: decodes and a jump-forward draft of 5 tokens
    (None, 30, 1),
    (None, 9, 4),  # private decode and draft
    (B, 7, 1),
    (B, 15, 1),
    (B, 1, 1),  # group B over scattered slots, one with no private past
    (A, 90, 80),  # a prompt chunk after the cached A prefix, next to the decodes
    (C, 4, 1),  # alone under its prefix: no group
    (None, 100, 100),  # a prefill chunk from scratch
]


@pytest.mark.parametrize("heads,kv_heads,dim", [(4, 4, 16), (9, 3, 64), (8, 2, 24)])
def test_cascade_equals_plain_attention_on_a_mixed_batch(heads, kv_heads, dim):
    batch = make_batch(MIXED)
    q, k, v = random_qkv(batch, heads, kv_heads, dim)
    plain = run_backend(batch, q, k, v)
    batch.prefix_groups = find_prefix_groups(
        batch.extend_lens,
        batch.seq_lens,
        batch.slot_rows,
        TorchAttentionBackend.max_short_extend,
        min_shared=16,
        min_saved=0,
    )
    assert sorted((tuple(gr.members), gr.shared_len) for gr in batch.prefix_groups) == [
        ((0, 1, 2), 70),
        ((5, 6, 7), 45),
    ]
    torch.testing.assert_close(run_backend(batch, q, k, v), plain, atol=FP32_TOL, rtol=FP32_TOL)


def test_cascade_in_bfloat16_stays_within_bfloat16_rounding_of_plain_attention():
    batch = make_batch(MIXED)
    q, k, v = (x.to(torch.bfloat16) for x in random_qkv(batch, 9, 3, 64))
    plain = run_backend(batch, q, k, v)
    batch.prefix_groups = find_prefix_groups(
        batch.extend_lens,
        batch.seq_lens,
        batch.slot_rows,
        TorchAttentionBackend.max_short_extend,
        min_shared=16,
        min_saved=0,
    )
    assert batch.prefix_groups
    torch.testing.assert_close(run_backend(batch, q, k, v), plain, atol=3e-2, rtol=3e-2)


def test_cascade_with_a_group_shorter_than_the_common_prefix_and_only_groups():
    """Groups given by hand (any shared_len within the cached part is valid), every short row in
    a group: no plain padded call at all."""
    batch = make_batch([(A, 5, 1), (A, 8, 3), (B, 2, 1), (B, 6, 2)])
    q, k, v = random_qkv(batch, 6, 2, 32, seed=5)
    plain = run_backend(batch, q, k, v)
    batch.prefix_groups = [PrefixGroup(50, [0, 1]), PrefixGroup(45, [2, 3])]
    torch.testing.assert_close(run_backend(batch, q, k, v), plain, atol=FP32_TOL, rtol=FP32_TOL)


def test_cli_flag_turns_cascade_off():
    from gateway.cli import build_parser, serve_settings

    assert serve_settings(build_parser().parse_args(["serve"]), environ={}).engine.cascade_attention is True
    argv = ["serve", "--no-cascade-attention"]
    assert serve_settings(build_parser().parse_args(argv), environ={}).engine.cascade_attention is False


# ------------------------------------------------------------------------------- the real model


@pytest.mark.e2e
def test_greedy_tokens_equal_with_cascade_on_and_off(real_engine, tokenizer, smollm_dir, formed_groups):
    from runtime.api import GenerateRequest
    from runtime.decode.sampling import SamplingParams
    from runtime.engine.engine import Engine
    from tests.conftest import chat_ids

    system = "You are a careful assistant for a travel agency. Answer briefly and politely. " * 3 + " ".join(
        f"Rule {i}: never book a flight on day {i} without asking the customer first." for i in range(1, 30)
    )
    questions = [
        "Can I fly to Rome?",
        "What is a layover?",
        "Book me a hotel.",
        "Is day 3 free?",
        "How long is a flight to Oslo?",
        "Do you sell trains?",
    ]
    prompts = [chat_ids(tokenizer, q, system=system) for q in questions]
    assert len(prompts[0]) > 400
    greedy = SamplingParams(max_new_tokens=12, temperature=0.0)

    formed = formed_groups

    def outputs(engine):
        engine.generate(prompts[0], greedy)  # caches the system prompt
        return [r.token_ids for r in engine.generate_many([GenerateRequest(p, greedy) for p in prompts])]

    with_cascade = outputs(real_engine)
    assert any(len(gr.members) >= 2 and gr.shared_len > 300 for gr in formed), "no shared-prefix group formed"
    off = Engine(kv_pool_tokens=8192, cascade_attention=False, debug_invariants=True).start()
    try:
        formed.clear()
        assert outputs(off) == with_cascade
        assert formed == []
    finally:
        off.shutdown()
