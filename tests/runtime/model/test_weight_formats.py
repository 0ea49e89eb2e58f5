"""Weight formats (runtime/model/linear.py, runtime/model/weight_format.py): the kernels compute what their
layouts say, q4 holds the GGUF's own weights, and each format's drift from the dequantized fp32
reference on the real SmolLM2 stays within its documented bound.

Measured drift (this file's 4 chat prompts, each teacher-forced along a fixed 64-token answer, 256
positions; "prefill" runs each case in one pass, "decode" feeds the answer one token per pass,
which is what generation does; attention through the cpu backend; printed by
`pytest -s -k drift tests/runtime/model/test_weight_formats.py`):
  format  top-1 agreement with fp32 (prefill / decode)   logits max-abs vs fp32 (prefill / decode)
  fp32    100% / 100%                                    0 / 0.0001 (another reduction order)
  bf16    97.3% / 98.4%                                  0.48 / 0.51
  q8      95.7% / 95.7%                                  1.86 / 1.86  (per-channel int8 re-quantized from fp32)
  q4      99.6% / 99.6%                                  0.54 / 0.54  (the GGUF's own Q4_1 codes, int4 kernel;
                                                         bf16 activations and logits layer)
The long-context cases (the same prompts after a ~650-token document, so every scored row sees more
than 512 keys and takes AMX tiles where they are on; `pytest -s -k long_context_drift`):
  q4 (vector attention)            97.3% / 97.3%      0.39 / 0.39
  q4 + tiles, float32 precision    97.7% / 97.7%      0.47 / 0.47
  q4 + tiles, bf16 precision       97.7% / 97.7%      0.44 / 0.44  (q and k in bf16; with the softmax
                                                      weights in one bf16 word too: 96.9%, so they keep two)
  q4, bf16 dot scores (Zen 4)      98.0% / 98.0%      0.42 / 0.42  (bf16 precision without AMX: q and k in
                                                      bf16, the values in float32; weights in one bf16 word
                                                      for bf16 value products too: 97.7%, not kept)
bf16, q8 and q4 run the fused layer ops (runtime/cpu_kernels/layer_ops.cpp); fp32 the torch ones.
q8 and q4 give the same logits on both paths: their kernels and the cpu attention backend compute a
row with the same bits for any number of rows.
The bounds below leave some room for other prompts' near-ties.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from runtime.attention import make_attention_backend
from runtime.forward_batch import ForwardBatch
from runtime.kvcache.pool import KVPool
from runtime.model.config import ModelLoadError
from runtime.model.decoder import DecoderModel, load_model, load_weights
from runtime.model.linear import DenseLinear, Int4Linear, Int8Linear
from runtime.model.loader import read_config, read_gguf_codes, source_gguf
from runtime.model.quant_codes import Int4Codes
from runtime.model.weight_format import choose_format
from tests.conftest import chat_ids

CPU = torch.device("cpu")


# ---- kernels (unit) ------------------------------------------------------------------------------


def test_int4_linear_computes_the_dequantized_product():
    torch.manual_seed(0)
    w = torch.randn(96, 128)
    codes = Int4Codes.quantize(w)
    x = torch.randn(5, 128)
    ref = x.bfloat16().float() @ codes.dequantize().t()
    out = Int4Linear(codes, None)(x)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, ref, atol=0.05 * ref.abs().max().item(), rtol=0.02)
    # the quantization itself: within half a step of each group's range
    step = (w.reshape(96, 4, 32).amax(-1) - w.reshape(96, 4, 32).amin(-1)) / 15
    assert ((codes.dequantize() - w).reshape(96, 4, 32).abs() <= step[..., None] / 2 + 1e-6).all()


def test_q4_1_blocks_map_onto_the_int4_layout_exactly():
    """w = d*q + m (GGUF Q4_1) equals (q - 8)*d + (m + 8d) (the kernel's scale/zero form)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize

    torch.manual_seed(1)
    w = torch.randn(8, 64).numpy()
    blocks = quantize(w, GGMLQuantizationType.Q4_1).reshape(8, 2, 20)
    d = torch.from_numpy(blocks[..., 0:2].copy().view(np.float16)[..., 0])
    m = torch.from_numpy(blocks[..., 2:4].copy().view(np.float16)[..., 0])
    qs = blocks[..., 4:]
    codes = torch.from_numpy(np.concatenate([qs & 0x0F, qs >> 4], axis=-1).reshape(8, 64))
    ref = dequantize(blocks.reshape(8, 40), GGMLQuantizationType.Q4_1)
    torch.testing.assert_close(Int4Codes.from_q4_1(d, m, codes).dequantize(), torch.from_numpy(ref), atol=1e-6, rtol=0)


def test_int8_and_dense_linears_keep_the_callers_dtype():
    torch.manual_seed(2)
    w, b, x = torch.randn(64, 32), torch.randn(64), torch.randn(3, 32)
    ref = x @ w.t() + b
    for lin, tol in (
        (DenseLinear(w, b, torch.float32), 1e-5),
        (DenseLinear(w, b, torch.bfloat16), 0.1),
        (Int8Linear(w, b), 0.15),
    ):
        out = lin(x)
        assert out.dtype == torch.float32
        torch.testing.assert_close(out, ref, atol=tol, rtol=0.05)
    assert torch.equal(DenseLinear(w, b, torch.float32)(x), torch.nn.functional.linear(x, w, b))


# ---- the choice (unit) ---------------------------------------------------------------------------


def test_format_choice_and_its_reason(monkeypatch):
    import runtime.model.weight_format as wf

    for flags in ({"avx2", "avx512_bf16"}, {"avx2", "amx_bf16"}):  # native bf16: q4 under invariant attention
        monkeypatch.setattr(wf, "cpu_flags", lambda: frozenset(flags))
        fmt, reason = choose_format("auto", CPU, torch.float32, gguf_q4=True, invariant_attention=True)
        assert fmt == "q4" and "batch-invariant" in reason and "--weights fp32" in reason and "avx2" in reason
        assert "AMX tiles" not in reason
    monkeypatch.setattr(wf, "cpu_flags", lambda: frozenset({"avx512_bf16", "amx_bf16", "amx_tile"}))
    assert (
        "int4 kernel on AMX tiles"
        in choose_format("auto", CPU, torch.float32, gguf_q4=True, invariant_attention=True)[1]
    )
    monkeypatch.setattr(wf, "cpu_flags", lambda: frozenset({"avx2", "fma"}))  # q4 through the AVX2 kernel
    fmt, reason = choose_format("auto", CPU, torch.float32, gguf_q4=True, invariant_attention=True)
    assert fmt == "q4" and "AVX2 + FMA" in reason and "integer dot products" in reason
    for flags, gguf_q4, invariant, dtype, why in (
        ({"avx2"}, True, True, torch.float32, "neither native bf16 nor AVX2 + FMA"),
        ({"avx512_bf16"}, False, True, torch.float32, "no GGUF blocks q4 runs as stored"),
        ({"avx512_bf16"}, True, False, torch.float32, "not batch-invariant"),
        ({"avx512_bf16"}, True, True, torch.bfloat16, "engine dtype"),
    ):
        monkeypatch.setattr(wf, "cpu_flags", lambda: frozenset(flags))
        fmt, reason = choose_format("auto", CPU, dtype, gguf_q4=gguf_q4, invariant_attention=invariant)
        assert fmt == "fp32" and why in reason, reason
    assert choose_format("auto", CPU, torch.float32, gguf_q4=True)[0] == "fp32"  # invariance is not assumed
    assert choose_format("q8", CPU, torch.float32, gguf_q4=True) == ("q8", "requested")
    assert (
        choose_format("auto", torch.device("cuda"), torch.bfloat16, gguf_q4=True, invariant_attention=True)[0] == "bf16"
    )
    assert choose_format("fp32", torch.device("cuda"), torch.bfloat16, gguf_q4=True)[0] == "fp32"
    with pytest.raises(ModelLoadError, match="CPU kernels only"):
        choose_format("q4", torch.device("cuda"), torch.bfloat16, gguf_q4=True)
    with pytest.raises(ModelLoadError, match="unknown format 'int3'"):
        choose_format("int3", CPU, torch.float32, gguf_q4=False)


def test_a_float_source_is_quantized_when_q4_is_requested(tiny_model_dir, tokenizer):
    cfg = read_config(tiny_model_dir)
    assert source_gguf(tiny_model_dir) is None
    model = load_model(tiny_model_dir, cfg, "q4", CPU, torch.float32)
    assert (model.weights, model.weights_reason) == ("q4", "requested")
    assert load_model(tiny_model_dir, cfg, "auto", CPU, torch.float32, invariant_attention=True).weights == "fp32"
    ids = chat_ids(tokenizer, "hello")
    ref = DecoderModel(cfg, load_weights(tiny_model_dir), CPU, torch.float32)
    assert (_prefill(model, cfg, ids) - _prefill(ref, cfg, ids)).abs().max() < 1.0


# ---- the real model (e2e) ------------------------------------------------------------------------

# (prompt, a 64-token continuation to teacher-force along: fixed text, so the reference is one pass)
CASES = [
    (
        "Write a short poem about the sea.",
        "The sea is wide and deep and blue, it sings to me the whole night through. Its waves roll in upon the "
        "shore, and then they leave to come once more. The gulls cry out above the foam, the sailors dream of "
        "sailing home, and every tide that turns the sand will write a story on the land, then wash it all away again.",
    ),
    (
        "What is the capital of France?",
        "The capital of France is Paris. It is the largest city in the country and sits on the river Seine in "
        "the north of France. Paris is known for the Eiffel Tower, the Louvre museum and its cafes, and about "
        "two million people live in the city itself, with many more in the towns and suburbs around it.",
    ),
    (
        "Explain photosynthesis in simple terms.",
        "Photosynthesis is how plants make their own food. They take in sunlight through their leaves, water "
        "through their roots, and carbon dioxide from the air. Using the energy of the light, they turn the water "
        "and carbon dioxide into sugar, which feeds the plant, and oxygen, which they release into the air we breathe.",
    ),
    (
        "List three uses of JSON.",
        "1. Sending data between a web server and a browser, for example the results of a search. 2. Storing "
        "configuration files for programs, since JSON is easy for people to read and edit. 3. Saving structured "
        "records, such as user profiles and orders, in document databases that many web applications use.",
    ),
]
CONTINUATION = 64
# format -> least top-1 agreement with fp32, and largest logits difference (see the module docstring)
MIN_AGREEMENT = {"fp32": 1.0, "bf16": 0.97, "q8": 0.95, "q4": 0.97}
MAX_LOGIT_DIFF = {"fp32": 1e-3, "bf16": 1.0, "q8": 2.5, "q4": 1.5}


def _attention(tiles_for: str | None = None, precision: str = "float32"):
    """The engine's default backend; with `tiles_for` (a format), on AMX tiles (--attention-tiles)
    at `precision` (--attention-precision), or without AMX at bf16 precision its bf16 dot scores."""
    attn = make_attention_backend("auto", CPU)
    if tiles_for is not None and not attn.enable_tiles(tiles_for, precision):
        pytest.skip("no AMX tiles (nor bf16 dot scores) on this CPU")
    return attn


@pytest.fixture
def dot_path(cpu_ops, request):
    """The bf16 dot scores on an AMX CPU too (its AMX path off; without AMX bf16 precision takes them anyway)."""
    if not cpu_ops.int4_linear_amx():
        pytest.skip("without AMX, +tiles-bf16 runs the bf16 dot scores")
    request.getfixturevalue("dot_scores_forced")


def _prefill(model, cfg, ids, attn=None):
    n = len(ids)
    kv = KVPool(cfg.num_layers, n + 8, cfg.num_kv_heads, cfg.head_dim)
    s = kv.allocator.alloc(n)
    return model.forward(
        ForwardBatch(torch.tensor(ids), torch.arange(n), s, [n], [n], [s], torch.arange(n)), kv, attn or _attention()
    )


def _decode_steps(model, cfg, ids, n_prompt, attn=None):
    """Logits at positions n_prompt-1 .. len(ids)-2 as a decode computes them: the prompt in one
    pass, then one token (one row) per pass, as generation does. Kernels may round differently for
    one row than for many (fp32 BLAS does; the bf16 logits layer rounds rows alike), so both paths
    are measured. Attention is the engine's default backend (cpu where it builds)."""
    n = len(ids)
    kv = KVPool(cfg.num_layers, n + 8, cfg.num_kv_heads, cfg.head_dim)
    slots = kv.allocator.alloc(n)
    attn = attn or _attention()
    p = slots[:n_prompt]
    rows = [
        model.forward(
            ForwardBatch(
                torch.tensor(ids[:n_prompt]),
                torch.arange(n_prompt),
                p,
                [n_prompt],
                [n_prompt],
                [p],
                torch.tensor([n_prompt - 1]),
            ),
            kv,
            attn,
        )
    ]
    for pos in range(n_prompt, n - 1):
        rows.append(
            model.forward(
                ForwardBatch(
                    torch.tensor([ids[pos]]),
                    torch.tensor([pos]),
                    slots[pos : pos + 1],
                    [1],
                    [pos + 1],
                    [slots[: pos + 1]],
                    torch.tensor([0]),
                ),
                kv,
                attn,
            )
        )
    return torch.cat(rows)


def long_document(case: int) -> str:
    """The long-context cases' document before case `case`'s prompt: the other cases' answers, three
    times (~650 tokens; not its own answer, which the model would then copy), so every scored row
    sees more than the cpu kernel's tiles_min_keys() (512) keys and takes the AMX tile path where
    tiles are on (the short cases never do)."""
    others = [answer for i, (_, answer) in enumerate(CASES) if i != case]
    return "Notes:\n\n" + "\n\n".join(others * 3) + "\n\n"


def _references(smollm_dir, tokenizer, long: bool = False):
    """The dequantized fp32 model's logits at the 64 continuation positions of each case."""
    cfg = read_config(smollm_dir)
    model = DecoderModel(cfg, load_weights(smollm_dir), CPU, torch.float32)
    out = []
    for i, (prompt, answer) in enumerate(CASES):
        ids = chat_ids(tokenizer, (long_document(i) if long else "") + prompt)
        cont = tokenizer.encode(answer, add_special_tokens=False)[:CONTINUATION]
        assert len(cont) == CONTINUATION, len(cont)
        out.append((ids + cont, len(ids), _prefill(model, cfg, ids + cont)[len(ids) - 1 : -1]))
    return cfg, out


@pytest.fixture(scope="module")
def reference(smollm_dir, tokenizer):
    return _references(smollm_dir, tokenizer)


@pytest.fixture(scope="module")
def long_reference(smollm_dir, tokenizer):
    return _references(smollm_dir, tokenizer, long=True)


@pytest.mark.e2e
def test_q4_holds_the_ggufs_own_weights(smollm_dir):
    from runtime.model.quant_codes import Int8Codes

    codes = read_gguf_codes(source_gguf(smollm_dir))
    cfg = read_config(smollm_dir)
    int4 = {k: v for k, v in codes.items() if isinstance(v, Int4Codes)}
    assert len(int4) == 7 * cfg.num_layers  # q, k, v, o, gate, up, down of every layer
    fp32 = load_weights(smollm_dir)
    for name in (
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.7.self_attn.k_proj.weight",
        "model.layers.29.mlp.down_proj.weight",
    ):
        assert torch.equal(int4[name].dequantize(), fp32[name])
    # the tied embedding is Q8_0: the logits layer of q4 runs its codes as they are
    embed = codes["model.embed_tokens.weight"]
    assert isinstance(embed, Int8Codes)
    assert torch.equal(embed.dequantize(), fp32["model.embed_tokens.weight"])


@pytest.mark.e2e
@pytest.mark.parametrize("fmt", ["fp32", "bf16", "q8", "q4", "q4+tiles", "q4+tiles-bf16"])
def test_format_drift_from_fp32_is_bounded(reference, smollm_dir, fmt):
    """Teacher-forced along a fixed continuation: at each of its 64 positions, does the format's top
    token equal fp32's, and how far apart are the logits. "+tiles": attention on AMX tiles (at
    bf16 precision: "+tiles-bf16"), which these short cases reach only past 512 keys: never."""
    _check_drift(reference, smollm_dir, fmt)


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["q4", "q4+tiles", "q4+tiles-bf16"])
def test_long_context_drift_from_fp32_is_bounded(long_reference, smollm_dir, fmt):
    """The same after a document of ~650 tokens (long_document): every scored row on the tile path
    where tiles are on, so this is where their precision shows."""
    _check_drift(long_reference, smollm_dir, fmt, " long")


@pytest.mark.e2e
@pytest.mark.slow
def test_long_context_drift_of_the_bf16_dot_scores_on_an_amx_cpu(dot_path, long_reference, smollm_dir):
    # dot_path first: without AMX it skips before the long reference is computed (14 s)
    """The bf16 dot scores (what a CPU with AVX512-BF16 and no AMX runs at bf16 precision), on an AMX CPU."""
    _check_drift(long_reference, smollm_dir, "q4+tiles-bf16", " long (bf16 dot)")


def _check_drift(reference, smollm_dir, fmt: str, label: str = "") -> None:
    cfg, refs = reference
    fmt, _, tiles = fmt.partition("+")
    attn = _attention(fmt if tiles else None, "bf16" if tiles == "tiles-bf16" else "float32")
    model = load_model(smollm_dir, cfg, fmt, CPU, torch.float32)
    assert model.weights == fmt
    for path, logits_of in (
        ("prefill", lambda ids, n: _prefill(model, cfg, ids, attn)[n - 1 : -1]),
        ("decode", lambda ids, n: _decode_steps(model, cfg, ids, n, attn)),
    ):
        agree = total = 0
        worst = 0.0
        for ids, n_prompt, ref_logits in refs:
            logits = logits_of(ids, n_prompt)
            assert logits.shape == ref_logits.shape
            agree += int((logits.argmax(-1) == ref_logits.argmax(-1)).sum())
            total += len(ref_logits)
            worst = max(worst, (logits - ref_logits).abs().max().item())
        print(
            f"{fmt}{' +' + tiles if tiles else ''}{label} {path}: top-1 agreement {agree / total:.4f}, "
            f"logits max-abs {worst:.4f}"
        )
        assert agree / total >= MIN_AGREEMENT[fmt], path
        assert worst <= MAX_LOGIT_DIFF[fmt], path


@pytest.mark.e2e
def test_auto_picks_q4_where_its_kernels_run_and_says_why(smollm_dir):
    from runtime.model.weight_format import AVX2_KERNELS, NATIVE_BF16, cpu_flags

    fast = any(f in cpu_flags() for f in NATIVE_BF16) or all(f in cpu_flags() for f in AVX2_KERNELS)
    cfg = read_config(smollm_dir)
    model = load_model(smollm_dir, cfg, "auto", CPU, torch.float32, invariant_attention=True)
    assert model.weights == ("q4" if fast else "fp32")
    assert "cpu capability" in model.weights_reason
    assert ("batch-invariant attention" if fast else "neither native bf16") in model.weights_reason
    if fast:  # the layers run the kernel the reason names
        avx2_only = not any(f in cpu_flags() for f in NATIVE_BF16)
        assert model.layers[0].qkv.kernel == (
            "jumpgate_cpu.int4_linear_i8" if avx2_only else "jumpgate_cpu.int4_linear"
        )
    model = load_model(smollm_dir, cfg, "auto", CPU, torch.float32, invariant_attention=False)
    assert (
        model.weights == "fp32" and ("not batch-invariant" if fast else "neither native bf16") in model.weights_reason
    )
