"""What the pathological-grammar tests share: does a compiled grammar accept a text, token by token."""

from __future__ import annotations

from grammar import CompiledGrammarHandle


def accepts(handle: CompiledGrammarHandle, tokenizer, text: str) -> bool:
    matcher = handle.new_matcher()
    return all(matcher.accept(t) for t in tokenizer.encode(text, add_special_tokens=False)) and matcher.is_completed()
