"""`python -m bench value_check`: what the value check (grammar/checks/value_check.py) adds to the mask time.

Each case walks one valid JSON text token by token through a real GrammarService matcher, twice:
with the value check and without it (the same compiled grammar). At each position the mask is
filled into an int32 [1, ceil(vocab/32)] row, then the token is accepted (both timed: the check
costs in both). Cases: open objects with many names (where every name written makes later names
worth checking), arrays under uniqueItems (strings, integers, listed values), an object under
dependentRequired, and every corpus schema with a valid example (tests/data/schema_corpus). One
JSON line per case (median µs per token over the repetitions), then a summary line (median and
worst extra µs per token).

  python -m bench value_check [--quick] [--reps N]
"""

from __future__ import annotations

import argparse
import json
import statistics

from bench.harness.common import default_tokenizer, emit, mask_walk_us
from bench.harness.workloads import CORPUS_DATA, corpus_examples
from grammar import GrammarService, GrammarSpec

OPEN = {"type": "object", "additionalProperties": {"type": "string"}}


def synthetic_cases() -> list[tuple[str, GrammarSpec, object]]:
    names = {f"field_{i}": f"value number {i}" for i in range(40)}
    words = ["apple", "pear", "plum", "cherry", "banana", "grape", "melon", "lemon", "lime", "kiwi"] * 2
    words = [f"{w}{i}" for i, w in enumerate(words)]
    unique = lambda items: {
        "type": "object",
        "required": ["xs"],  # noqa: E731
        "properties": {"xs": {"type": "array", "items": items, "uniqueItems": True}},
    }
    dependent = {
        "type": "object",
        "properties": {f"p{i}": {"type": "string"} for i in range(6)},
        "dependentRequired": {"p0": ["p3", "p5"], "p1": ["p4"]},
    }
    colors = ["red", "green", "blue", "cyan", "magenta", "yellow", "black", "white"]
    return [
        ("open_object_40_names", GrammarSpec.json_schema(OPEN), names),
        ("json_object_40_names", GrammarSpec.of("json_object", None), names),
        ("unique_strings_20", GrammarSpec.json_schema(unique({"type": "string"})), {"xs": words}),
        ("unique_integers_30", GrammarSpec.json_schema(unique({"type": "integer"})), {"xs": list(range(100, 130))}),
        ("unique_enum_8", GrammarSpec.json_schema(unique({"enum": colors})), {"xs": colors}),
        ("dependent_required_6", GrammarSpec.json_schema(dependent), {f"p{i}": f"value {i}" for i in range(6)}),
    ]


def corpus_cases() -> list[tuple[str, GrammarSpec, object]]:
    refused = json.loads((CORPUS_DATA / "schema_corpus_refusals.json").read_text())
    return [
        (name, GrammarSpec.json_schema(schema), value)
        for name, schema, value in corpus_examples()
        if name not in refused
    ]


def time_walk(handle, tokens: list[int], words: int, reps: int) -> float:
    """Median µs per token to fill the mask and accept the token along `tokens`."""
    us = mask_walk_us(handle.new_matcher, tokens, words, reps, timed_accept=True)
    if us is None:
        raise AssertionError("a token of the valid example was refused")
    return us


def run(quick: bool = False, argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench value_check")
    ap.add_argument("--reps", type=int, default=3 if quick else 7)
    args = ap.parse_args(argv or [])
    tokenizer, vocab = default_tokenizer()
    service = GrammarService(tokenizer, vocab)
    words = (vocab + 31) // 32
    extras = []
    cases = synthetic_cases() + ([] if quick else corpus_cases())
    try:
        for name, spec, value in cases:
            handle = service.compile(spec)
            if handle.value_check is None:
                continue
            bare = handle.without_value_check()
            text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
            tokens = tokenizer.encode(text, add_special_tokens=False)
            with_us = time_walk(handle, tokens, words, args.reps)
            without_us = time_walk(bare, tokens, words, args.reps)
            extras.append(with_us - without_us)
            emit(
                {
                    "metric": "value_check_us_per_token",
                    "case": name,
                    "tokens": len(tokens),
                    "with_check_us": with_us,
                    "without_check_us": without_us,
                    "extra_us": with_us - without_us,
                }
            )
    finally:
        service.close()
    if extras:
        emit(
            {
                "metric": "value_check_us_per_token_summary",
                "cases": len(extras),
                "median_extra_us": statistics.median(extras),
                "max_extra_us": max(extras),
            }
        )
