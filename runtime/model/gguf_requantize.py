"""A GGUF file rewritten as llama.cpp's Q4_K_M mix (`write_q4_k_m`): what most GGUF downloads are,
made locally from a model Jumpgate has, for the K-quant tests and `python -m bench engine`'s q4k
format. Metadata and tokenizer are copied as they are; every matrix gets the type llama.cpp's
llama_tensor_get_type gives it under Q4_K_M (`q4_k_m_type`), its blocks written by
runtime/model/gguf_blocks.py (gguf-py quantizes Q5_0/Q8_0 only)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T

from runtime.model.gguf_blocks import QK_K, quantize

Q4_K_M_FILE_TYPE = 15  # llama_ftype LLAMA_FTYPE_MOSTLY_Q4_K_M
# llama.cpp's fallback where a row is not whole 256-weight super-blocks
FALLBACK = {T.Q4_K: T.Q5_0, T.Q5_K: T.Q5_1, T.Q6_K: T.Q8_0}


def use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's choice of the layers that get more bits (the first and last eighth, every third)."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def q4_k_m_type(name: str, n_layers: int, k: int, has_output: bool) -> T:
    """The block type of GGUF matrix `name` (rows of `k` weights) in a Q4_K_M file: Q6_K for the
    output (or the tied embedding), attn_v and ffn_down of the `use_more_bits` layers; Q4_K for the
    rest; the fallback type where `k` is not a multiple of 256."""
    layer = int(name.split(".")[1]) if name.startswith("blk.") else -1
    if name == "output.weight" or (name == "token_embd.weight" and not has_output):
        kind = T.Q6_K
    elif (".attn_v." in name or ".ffn_down" in name) and use_more_bits(layer, n_layers):
        kind = T.Q6_K
    else:
        kind = T.Q4_K
    return kind if k % QK_K == 0 else FALLBACK[kind]


def write_q4_k_m(src: Path, dst: Path) -> Path:
    """`src` (a GGUF of any types) as a Q4_K_M file at `dst`: each matrix dequantized and written in
    its Q4_K_M type (kept as stored where it already is that type); vectors (norms) as they are."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter
    from gguf.quants import dequantize
    from gguf.quants import quantize as gguf_quantize

    reader = GGUFReader(str(src))
    arch = reader.fields["general.architecture"].contents()
    n_layers = int(reader.fields[f"{arch}.block_count"].contents())
    has_output = any(t.name == "output.weight" for t in reader.tensors)
    writer = GGUFWriter(str(dst), arch)
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name in ("general.architecture", "general.file_type"):
            continue
        sub = field.types[-1] if field.types[0] == GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), field.types[0], sub)
    writer.add_file_type(Q4_K_M_FILE_TYPE)
    for t in reader.tensors:
        if len(t.shape) < 2:
            writer.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
            continue
        k = int(t.shape[0])
        kind = q4_k_m_type(t.name, n_layers, k, has_output)
        if kind == t.tensor_type:
            writer.add_tensor(t.name, np.asarray(t.data), raw_dtype=kind)
            continue
        w = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(-1, k)
        blocks = quantize(w, kind) if kind in (T.Q4_K, T.Q5_K, T.Q6_K) else gguf_quantize(w, kind)
        rows = [int(d) for d in reversed(t.shape[1:])]  # stacked experts keep their [E, N] rows
        writer.add_tensor(t.name, blocks.reshape(*rows, -1), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst
