"""All decoder layers in one C++ call (runtime/cpu_kernels/decoder_layers.cpp) against the Python
layer loop it replaces (runtime/model/decoder.py's `_fused_layer`): the same kernels in the same order, so
the logits and every K/V written are bit for bit the same, for each fused format, a mixed pass
(prefill chunks over cached prefixes, decodes, a prefix group read once), and q/k/v biases.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from runtime.attention import make_attention_backend
from runtime.attention.cascade import find_prefix_groups
from runtime.forward_batch import ForwardBatch
from runtime.kvcache.pool import KVPool
from runtime.model.decoder import load_model
from runtime.model.loader import read_config
from tests.conftest import make_tiny_llama

CPU = torch.device("cpu")


def mixed_pass(prompts: list[list[int]], new: list[int], shared: int) -> tuple[ForwardBatch, int]:
    """One pass over the last `new[i]` tokens of each prompt, the rest already cached; the first
    `shared` slots are the same for every request (one prefix in the pool), so the pass forms a
    prefix group where the cpu backend groups. Returns the batch and the slots it needs."""
    ids, positions, out_slots, rows = [], [], [], []
    next_slot = shared
    for p, n in zip(prompts, new):
        own = torch.arange(next_slot, next_slot + len(p) - shared)
        next_slot += len(p) - shared
        row = torch.cat([torch.arange(shared), own])
        rows.append(row)
        ids.extend(p[len(p) - n :])
        positions.extend(range(len(p) - n, len(p)))
        out_slots.append(row[len(p) - n :])
    ends = torch.tensor(new).cumsum(0) - 1
    batch = ForwardBatch(
        torch.tensor(ids),
        torch.tensor(positions),
        torch.cat(out_slots),
        list(new),
        [len(p) for p in prompts],
        rows,
        ends,
    )
    batch.prefix_groups = find_prefix_groups(batch.extend_lens, batch.seq_lens, rows, 64, min_shared=8, min_saved=0)
    return batch, next_slot


def both_paths(model, cfg, prompts, new, shared, attn=None):
    """(logits, K, V) of the pass through the one-call loop and through the Python loop, each from
    the same pool contents (the cached prefix written by a first pass of the Python loop)."""
    attn = attn or make_attention_backend("auto", CPU)
    assert attn.name.startswith("cpu"), attn.name  # the kernel the one call runs
    batch, slots = mixed_pass(prompts, new, shared)
    kv = KVPool(
        cfg.num_layers, slots + 1, cfg.num_kv_heads, cfg.head_dim, torch.float32, CPU, head_major=attn.kv_head_major
    )
    # the cached part: every prompt's earlier tokens, written once through the plain loop
    with model.python_layer_loop():
        for row, p, n in zip(batch.slot_rows, prompts, new):
            m = len(p) - n
            model.forward(
                ForwardBatch(torch.tensor(p[:m]), torch.arange(m), row[:m], [m], [m], [row[:m]], torch.tensor([m - 1])),
                kv,
                attn,
            )
    start = ([t.clone() for t in kv.k], [t.clone() for t in kv.v])
    out = {}
    for path in ("one call", "python"):
        kv.k, kv.v = [t.clone() for t in start[0]], [t.clone() for t in start[1]]
        with model.python_layer_loop() if path == "python" else contextlib.nullcontext():
            out[path] = (model.forward(batch, kv, attn), torch.stack(kv.k), torch.stack(kv.v))
    assert batch.prefix_groups, "the pass should read its shared prefix once"
    return out


@pytest.mark.parametrize("fmt", ["q4", "q8", "bf16"])
def test_one_call_equals_the_python_layer_loop_on_the_real_model(cpu_ops, smollm_dir, tokenizer, fmt):
    cfg = read_config(smollm_dir)
    model = load_model(smollm_dir, cfg, fmt, CPU, torch.float32)
    assert model.layer_loop is not None, f"{fmt}: every layer should run in the one call here"
    system = tokenizer.encode("You are a careful assistant that answers in one short sentence. " * 3)
    prompts = [
        system + tokenizer.encode(q)
        for q in ("Name a river.", "What is the tallest mountain on Earth?", "Say hello.", "Count to five please.")
    ]
    new = [1, 1, 5, len(prompts[3]) - len(system) - 2]  # two decodes, a short extend, a longer chunk
    out = both_paths(model, cfg, prompts, new, len(system))
    for a, b in zip(out["one call"], out["python"]):
        assert torch.equal(a, b)
    assert out["one call"][0].shape[0] == len(prompts)


@pytest.mark.parametrize("precision", ["float32", "bf16"])
def test_one_call_equals_the_python_layer_loop_on_amx_tiles(cpu_ops, smollm_dir, tokenizer, precision):
    """The same with attention on AMX tiles at either --attention-precision, the rows past 512 keys
    (a ~600-token shared prefix): the one call hands the precision to the kernel as the Python loop does."""
    attn = make_attention_backend("auto", CPU)
    if not attn.enable_tiles("q4", precision):
        pytest.skip("no AMX tiles on this CPU")
    cfg = read_config(smollm_dir)
    model = load_model(smollm_dir, cfg, "q4", CPU, torch.float32)
    system = tokenizer.encode("You are a careful assistant that answers in one short sentence. " * 50)
    assert len(system) > cpu_ops.tiles_min_keys()
    prompts = [system + tokenizer.encode(q) for q in ("Name a river.", "Say hello.", "Count to five please.")]
    new = [1, 5, len(prompts[2]) - len(system) - 2]
    out = both_paths(model, cfg, prompts, new, len(system), attn)
    for a, b in zip(out["one call"], out["python"]):
        assert torch.equal(a, b)


def test_one_call_adds_the_qkv_biases_as_the_python_loop_does(cpu_ops, tmp_path, smollm_dir):
    """A Qwen2-style model (q/k/v biases) in q4 and bf16: the bias path of the loop."""
    model_dir = make_tiny_llama(tmp_path / "biased", smollm_dir, attention_bias=True)
    cfg = read_config(model_dir)
    assert cfg.attention_bias
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 49152, (40,), generator=g).tolist() for _ in range(3)]
    for p in prompts[1:]:
        p[:24] = prompts[0][:24]
    for fmt in ("q4", "bf16"):
        model = load_model(model_dir, cfg, fmt, CPU, torch.float32)
        assert model.layer_loop is not None and model.layers[0].qkv.bias is not None
        out = both_paths(model, cfg, prompts, [1, 3, 16], 24)
        for a, b in zip(out["one call"], out["python"]):
            assert torch.equal(a, b), fmt


def test_a_linear_only_python_can_run_keeps_the_python_loop(cpu_ops, smollm_dir):
    """aten's int4 kernel (q4 where ours is not built) takes a group size, not a loop kind: the
    model then keeps its Python loop rather than failing."""
    from runtime.model.linear import Int4Linear

    cfg = read_config(smollm_dir)
    model = load_model(smollm_dir, cfg, "q4", CPU, torch.float32)
    layer = model.layers[5]
    codes = layer.o_proj
    assert codes.loop_spec() is not None
    layer.o_proj = Int4Linear.__new__(Int4Linear)
    layer.o_proj.__dict__.update(codes.__dict__, _ops=None)
    assert layer.o_proj.loop_spec() is None
    assert model.layer_loop_spec() is None


def test_bad_tables_raise_instead_of_running(cpu_ops, smollm_dir):
    cfg = read_config(smollm_dir)
    model = load_model(smollm_dir, cfg, "q4", CPU, torch.float32)
    kinds, params = model.layer_loop_spec()
    weights = torch.classes.jumpgate_cpu.DecoderWeights
    with pytest.raises(RuntimeError, match="kinds"):
        weights(kinds[:-1], params)
    bad = list(kinds)
    bad[0] = 99
    with pytest.raises(RuntimeError, match="unknown linear kind 99"):
        weights(bad, params)
    h = torch.zeros(1, cfg.hidden_size)
    # the first layer's activation dtype: bf16 where its kernel takes bf16, float32 on AVX2
    x = torch.zeros(1, cfg.hidden_size, dtype=model.layers[0].qkv.act_dtype)
    kv = KVPool(cfg.num_layers, 4, cfg.num_kv_heads, cfg.head_dim, torch.float32, CPU, head_major=True)
    cos = sin = torch.zeros(1, cfg.head_dim)
    meta = torch.tensor([[0, 1, 1, 0, -1, 0]])
    with pytest.raises(RuntimeError, match="caches"):
        cpu_ops.decoder_layers(
            h,
            x,
            cos,
            sin,
            torch.tensor([0]),
            kv.k[:-1],
            kv.v[:-1],
            model.layer_loop,
            torch.tensor([0]),
            meta,
            False,
            cfg.num_heads,
            1e-5,
        )
    with pytest.raises(RuntimeError, match="slot out of range"):
        cpu_ops.decoder_layers(
            h,
            x,
            cos,
            sin,
            torch.tensor([9]),
            kv.k,
            kv.v,
            model.layer_loop,
            torch.tensor([0]),
            meta,
            False,
            cfg.num_heads,
            1e-5,
        )


def test_a_one_call_model_runs_its_layers_in_python_under_the_torch_backend(cpu_ops, tmp_path, smollm_dir):
    """A model built with the one-call loop (bf16) handed the torch backend, which has no paged
    tables for the kernel: the pass runs the Python layer loop, with the same logits."""
    from runtime.attention import TorchAttentionBackend

    model_dir = make_tiny_llama(tmp_path / "tiny", smollm_dir)
    cfg = read_config(model_dir)
    model = load_model(model_dir, cfg, "bf16", CPU, torch.float32)
    assert model.layer_loop is not None
    attn = TorchAttentionBackend()
    assert attn.paged_tables() is None
    prompt = torch.randint(0, 49152, (12,), generator=torch.Generator().manual_seed(5)).tolist()
    n = len(prompt)
    out = []
    for loop in ("one call", "python"):
        kv = KVPool(cfg.num_layers, n + 1, cfg.num_kv_heads, cfg.head_dim, torch.float32, CPU)
        batch = ForwardBatch(
            torch.tensor(prompt), torch.arange(n), torch.arange(n), [n], [n], [torch.arange(n)], torch.tensor([n - 1])
        )
        with model.python_layer_loop() if loop == "python" else contextlib.nullcontext():
            out.append(model.forward(batch, kv, attn))
    assert torch.isfinite(out[0]).all() and torch.equal(out[0], out[1])
