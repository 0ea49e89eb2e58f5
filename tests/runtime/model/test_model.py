"""Our forward pass equals transformers' on the same weights; extend-with-prefix equals prefill."""

from __future__ import annotations

import pytest
import torch

from runtime.attention import TorchAttentionBackend
from runtime.forward_batch import ForwardBatch
from runtime.kvcache.pool import KVPool
from runtime.model.decoder import DecoderModel, load_weights
from runtime.model.loader import read_config
from tests.conftest import chat_ids, make_tiny_llama


def _load(model_dir):
    cfg = read_config(model_dir)
    return cfg, DecoderModel(cfg, load_weights(model_dir), torch.device("cpu"), torch.float32)


def _prefill(model, cfg, ids, kv=None, slots=None):
    kv = kv or KVPool(cfg.num_layers, 4096, cfg.num_kv_heads, cfg.head_dim)
    n = len(ids)
    slots = kv.allocator.alloc(n) if slots is None else slots
    batch = ForwardBatch(torch.tensor(ids), torch.arange(n), slots, [n], [n], [slots], torch.arange(n))
    return model.forward(batch, kv, TorchAttentionBackend()), kv, slots


def _hf_logits(model_dir, ids):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0]


def test_tiny_llama_matches_transformers(tiny_model_dir, tokenizer):
    ids = chat_ids(tokenizer, "Hello there, how are you?")
    cfg, model = _load(tiny_model_dir)
    ours, _, _ = _prefill(model, cfg, ids)
    torch.testing.assert_close(ours, _hf_logits(tiny_model_dir, ids), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(
    "scaling",
    [
        {"rope_type": "linear", "factor": 2.0},
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    ],
)
def test_rope_scaling_variants_match_transformers(tmp_path, smollm_dir, tokenizer, scaling):
    d = make_tiny_llama(tmp_path / "m", smollm_dir, rope_scaling=scaling)
    ids = chat_ids(tokenizer, "A longer prompt so that positions pass the original context. " * 4)
    cfg, model = _load(d)
    ours, _, _ = _prefill(model, cfg, ids)
    torch.testing.assert_close(ours, _hf_logits(d, ids), atol=1e-4, rtol=1e-4)


def test_qwen2_style_biases_match_transformers(tmp_path, smollm_dir, tokenizer):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(
        vocab_size=49152,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    torch.manual_seed(1)
    m = Qwen2ForCausalLM(cfg)
    m.save_pretrained(str(tmp_path))
    import shutil

    shutil.copy(smollm_dir / "tokenizer.json", tmp_path / "tokenizer.json")
    ids = chat_ids(tokenizer, "Qwen-style attention biases")
    c, model = _load(tmp_path)
    assert c.attention_bias
    ours, _, _ = _prefill(model, c, ids)
    torch.testing.assert_close(ours, _hf_logits(tmp_path, ids), atol=1e-4, rtol=1e-4)


@pytest.mark.e2e
def test_real_smollm2_matches_transformers(smollm_dir, tokenizer):
    ids = chat_ids(
        tokenizer, "What is the capital of France? Answer in one word.", system="You are a concise assistant."
    )
    cfg, model = _load(smollm_dir)
    ours, _, _ = _prefill(model, cfg, ids)
    ref = _hf_logits(smollm_dir, ids)
    torch.testing.assert_close(ours, ref, atol=2e-3, rtol=1e-3)
    assert torch.equal(ours.argmax(-1), ref.argmax(-1))


def test_extend_with_cached_prefix_equals_full_prefill(tiny_model_dir, tokenizer):
    ids = chat_ids(tokenizer, "Extend a cached prefix with the rest of the prompt, please.")
    cfg, model = _load(tiny_model_dir)
    full, _, _ = _prefill(model, cfg, ids)
    kv = KVPool(cfg.num_layers, 4096, cfg.num_kv_heads, cfg.head_dim)
    slots = kv.allocator.alloc(len(ids))
    p = len(ids) - 7
    _prefill(model, cfg, ids[:p], kv, slots[:p])
    rest = ForwardBatch(
        torch.tensor(ids[p:]),
        torch.arange(p, len(ids)),
        slots[p:],
        [len(ids) - p],
        [len(ids)],
        [slots],
        torch.arange(len(ids) - p),
    )
    ext = model.forward(rest, kv, TorchAttentionBackend())
    torch.testing.assert_close(ext, full[p:], atol=1e-5, rtol=1e-5)


def test_batched_mixed_extend_and_decode_equal_separate_passes(tiny_model_dir, tokenizer):
    """One pass holding a decode row and an extend chunk gives the same logits as two passes."""
    cfg, model = _load(tiny_model_dir)
    a = chat_ids(tokenizer, "first request")
    b = chat_ids(tokenizer, "second, longer request with more words in it")
    la, kv, sa = _prefill(model, cfg, a)
    # decode one token for a, and prefill b, in one pass
    nxt = int(la[-1].argmax())
    s_new = kv.allocator.alloc(1)
    sb = kv.allocator.alloc(len(b))
    rows_a = torch.cat([sa, s_new])
    batch = ForwardBatch(
        torch.tensor([nxt] + b),
        torch.tensor([len(a)] + list(range(len(b)))),
        torch.cat([s_new, sb]),
        [1, len(b)],
        [len(a) + 1, len(b)],
        [rows_a, sb],
        torch.tensor([0, len(b)]),
    )
    mixed = model.forward(batch, kv, TorchAttentionBackend())
    alone_b, _, _ = _prefill(model, cfg, b)
    torch.testing.assert_close(mixed[1], alone_b[-1], atol=1e-5, rtol=1e-5)
    kv2 = KVPool(cfg.num_layers, 4096, cfg.num_kv_heads, cfg.head_dim)
    full_a, _, _ = _prefill(model, cfg, a + [nxt], kv2)
    torch.testing.assert_close(mixed[0], full_a[-1], atol=1e-5, rtol=1e-5)


def test_pass_with_decodes_drafts_and_a_prefill_equals_full_prefills(tiny_model_dir, tokenizer):
    """The torch backend's kinds of rows in one pass (single-token decodes of unequal lengths and
    short multi-token extends, as when jump-forward drafts are verified, padded together; a long
    prefill on its own): every row's logits equal those of a full prefill of that sequence alone."""
    cfg, model = _load(tiny_model_dir)
    prompts = [
        chat_ids(tokenizer, t)
        for t in (
            "first request",
            "a second, longer request with more words",
            "third one",
            "fourth request, whose draft is four tokens",
        )
    ]
    kv = KVPool(cfg.num_layers, 4096, cfg.num_kv_heads, cfg.head_dim)
    cached = [_prefill(model, cfg, p, kv)[2] for p in prompts]
    new = {0: [17], 1: [23, 5, 99, 41], 2: [8], 3: [61, 62, 63]}  # decode, draft, decode, draft
    prefill = chat_ids(tokenizer, "a fresh prompt that is prefilled in the same pass " * 5)
    ids, positions, out_slots, ext_lens, seq_lens, rows = [], [], [], [], [], []
    for i, p in enumerate(prompts):
        s = kv.allocator.alloc(len(new[i]))
        ids += new[i]
        positions += range(len(p), len(p) + len(new[i]))
        out_slots.append(s)
        ext_lens.append(len(new[i]))
        seq_lens.append(len(p) + len(new[i]))
        rows.append(torch.cat([cached[i], s]))
    s = kv.allocator.alloc(len(prefill))
    ids += prefill
    positions += range(len(prefill))
    out_slots.append(s)
    ext_lens.append(len(prefill))
    seq_lens.append(len(prefill))
    rows.append(s)
    assert len(prefill) > TorchAttentionBackend.max_short_extend
    n = len(ids)
    batch = ForwardBatch(
        torch.tensor(ids), torch.tensor(positions), torch.cat(out_slots), ext_lens, seq_lens, rows, torch.arange(n)
    )
    mixed = model.forward(batch, kv, TorchAttentionBackend())
    at = 0
    for i, p in enumerate(prompts):
        alone, _, _ = _prefill(model, cfg, p + new[i])
        torch.testing.assert_close(mixed[at : at + len(new[i])], alone[len(p) :], atol=1e-5, rtol=1e-5)
        at += len(new[i])
    alone, _, _ = _prefill(model, cfg, prefill)
    torch.testing.assert_close(mixed[at:], alone, atol=1e-5, rtol=1e-5)
