"""The xgrammar view of a Hugging Face tokenizer, with the model's special tokens fenced off.

`xgrammar.TokenizerInfo.from_huggingface` treats added special tokens such as `<|endoftext|>` or
`<|im_start|>` as ordinary text: a JSON string could then "contain" `<|im_start|>` as one token,
which the model would happily sample. xgrammar treats tokens with an empty decoded form as
special (never allowed by a grammar), so those entries are blanked here, except the stop tokens,
which the matcher must still accept at the end.
"""

from __future__ import annotations

from typing import Any

import xgrammar as xgr


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
    """Ids of added tokens marked special (chat markers, EOS, ...)."""
    added = getattr(hf_tokenizer, "added_tokens_decoder", None) or {}
    ids = {int(i) for i, tok in added.items() if getattr(tok, "special", False)}
    ids.update(int(i) for i in (getattr(hf_tokenizer, "all_special_ids", None) or []))
    return sorted(ids)


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
