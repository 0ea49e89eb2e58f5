"""The xgrammar view of a Hugging Face tokenizer, with the model's special tokens fenced off.

`xgrammar.TokenizerInfo.from_huggingface` treats added special tokens such as `<|endoftext|>` or
`<|im_start|>` as ordinary text: a JSON string could then "contain" `<|im_start|>` as one token,
which the model would happily sample. xgrammar treats tokens with an empty decoded form as
special (never allowed by a grammar), so those entries are blanked here, except the stop tokens,
which the matcher must still accept at the end.

Special tokens that a model format writes in its output are kept as text: gpt-oss's `<|channel|>`,
`<|message|>`, `<|call|>`..., Kimi's `<|tool_calls_section_begin|>`, Mistral's `[TOOL_CALLS]`
are special in their tokenizers, and a grammar that could not take them would force the marker
spelled in plain pieces, which the model never writes. Which tokens those are is read from the
text of every model format xgrammar describes (`output_markers`).
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

import xgrammar as xgr

# xgrammar 0.2.9's model formats (get_model_structural_tag), and the markers of formats written by
# hand (grammar/kinds/tool_calls: mistral) or of think blocks
XGRAMMAR_MODEL_FORMATS = (
    "llama",
    "qwen_3",
    "qwen_3_coder",
    "qwen_3_5",
    "mimo",
    "harmony",
    "deepseek_r1",
    "deepseek_v3_1",
    "deepseek_v3_2",
    "deepseek_v4",
    "deepseek_v4_1",
    "kimi",
    "kimi_k3",
    "glm_4_7",
    "minimax",
    "minimax_m3",
    "gemma_4",
    "cohere",
    "exaone",
)
OTHER_MARKERS = ("[TOOL_CALLS]", "[ARGS]", "<think>", "</think>")


@lru_cache(maxsize=1)
def _formats_text() -> str:
    tool = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    texts = list(OTHER_MARKERS)
    for name in XGRAMMAR_MODEL_FORMATS:
        try:
            tag = xgr.get_model_structural_tag(name, tools=tool, tool_choice="auto", reasoning=True)
        except Exception:  # a format this xgrammar does not know
            continue
        texts.append(json.dumps(tag.model_dump(mode="json", exclude_none=True), ensure_ascii=False))
    return "\n".join(texts)


def output_markers(hf_tokenizer: Any) -> set[str]:
    """The special tokens' texts that some model format writes in its output."""
    text = _formats_text()
    added = getattr(hf_tokenizer, "added_tokens_decoder", None) or {}
    return {str(tok) for tok in added.values() if len(str(tok)) > 1 and str(tok) in text}


def marker_token_ids(hf_tokenizer: Any) -> list[int]:
    """Ids of the added tokens whose text some model format writes (`output_markers`)."""
    markers = output_markers(hf_tokenizer)
    added = getattr(hf_tokenizer, "added_tokens_decoder", None) or {}
    return sorted(int(i) for i, tok in added.items() if str(tok) in markers)


def default_stop_token_ids(hf_tokenizer: Any) -> list[int]:
    eos = getattr(hf_tokenizer, "eos_token_id", None)
    if eos is None:
        raise ValueError("the tokenizer has no eos_token_id; pass stop_token_ids explicitly")
    return [int(eos)]


def build_tokenizer_info(
    hf_tokenizer: Any, vocab_size: int, stop_token_ids: list[int] | None = None
) -> xgr.TokenizerInfo:
    stop_ids = list(stop_token_ids) if stop_token_ids else default_stop_token_ids(hf_tokenizer)
    # from_huggingface detects the vocabulary type and prefix-space behaviour for us.
    detected = xgr.TokenizerInfo.from_huggingface(hf_tokenizer, vocab_size=vocab_size, stop_token_ids=stop_ids)
    encoded_vocab = [""] * vocab_size
    for token, idx in hf_tokenizer.get_vocab().items():
        if idx < vocab_size:
            encoded_vocab[idx] = token
    for idx in special_token_ids(hf_tokenizer):
        if idx < vocab_size and idx not in stop_ids:
            encoded_vocab[idx] = ""
    return xgr.TokenizerInfo(
        encoded_vocab,
        detected.vocab_type,
        vocab_size=vocab_size,
        stop_token_ids=stop_ids,
        add_prefix_space=detected.add_prefix_space,
    )


def special_token_ids(hf_tokenizer: Any) -> list[int]:
    """Ids of added tokens marked special (chat markers, EOS, ...), less the model formats' output
    markers (`output_markers`)."""
    added = getattr(hf_tokenizer, "added_tokens_decoder", None) or {}
    ids = {int(i) for i, tok in added.items() if getattr(tok, "special", False)}
    ids.update(int(i) for i in (getattr(hf_tokenizer, "all_special_ids", None) or []))
    markers = output_markers(hf_tokenizer)
    return sorted(i for i in ids if str(added.get(i, "")) not in markers)


def make_encoder(hf_tokenizer: Any):
    """Text -> token ids as the model's tokenizer would produce them, without BOS/EOS."""
    backend = getattr(hf_tokenizer, "backend_tokenizer", None)
    if backend is not None:  # the Rust tokenizer directly: several times faster than __call__

        def encode(text: str) -> list[int]:
            return backend.encode(text, add_special_tokens=False).ids
    else:

        def encode(text: str) -> list[int]:
            return list(hf_tokenizer.encode(text, add_special_tokens=False))

    return encode
