"""`python -m bench value_check`: what the value check (grammar/value_check.py) adds to the mask time.

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
import time

import jsonschema
import torch

from bench.common import emit
from bench.workloads import ROOT
from grammar import GrammarService, GrammarSpec

DATA = ROOT / "tests" / "data"
OPEN = {"type": "object", "additionalProperties": {"type": "string"}}


def synthetic_cases() -> list[tuple[str, GrammarSpec, object]]:
    names = {f"field_{i}": f"value number {i}" for i in range(40)}
    words = ["apple", "pear", "plum", "cherry", "banana", "grape", "melon", "lemon", "lime", "kiwi"] * 2
    words = [f"{w}{i}" for i, w in enumerate(words)]
    unique = lambda items: {"type": "object", "required": ["xs"],  # noqa: E731
                            "properties": {"xs": {"type": "array", "items": items, "uniqueItems": True}}}
    dependent = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(6)},
                 "dependentRequired": {"p0": ["p3", "p5"], "p1": ["p4"]}}
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
    examples = json.loads((DATA / "schema_corpus_examples.json").read_text())
    refused = json.loads((DATA / "schema_corpus_refusals.json").read_text())
    cases = []
    for path in sorted((DATA / "schema_corpus").glob("*.json")):
        schema = json.loads(path.read_text())
        valid = [v for v in examples.get(path.stem) or [] if jsonschema.Draft202012Validator(schema).is_valid(v)]
        if valid and path.stem not in refused:
            cases.append((path.stem, GrammarSpec.json_schema(schema), valid[0]))
    return cases


def time_walk(handle, tokens: list[int], words: int, reps: int) -> float:
    """Median µs per token to fill the mask and accept the token along `tokens`."""
    bitmask = torch.zeros((1, words), dtype=torch.int32)
    per_rep = []
    for rep in range(reps + 1):  # the first pass warms lazy caches and is not counted
        matcher = handle.new_matcher()
        spent = 0.0
        for token_id in tokens:
            started = time.perf_counter()
            matcher.fill_bitmask(bitmask, 0)
            ok = matcher.accept(token_id)
            spent += time.perf_counter() - started
            if not ok:
                raise AssertionError(f"token {token_id} refused")
        if rep:
            per_rep.append(spent / len(tokens) * 1e6)
    return statistics.median(per_rep)


def run(quick: bool = False, argv: list[str] | None = None) -> None:
    from transformers import AutoTokenizer

    from runtime.loader import read_config, resolve_model_dir

    ap = argparse.ArgumentParser(prog="python -m bench value_check")
    ap.add_argument("--reps", type=int, default=3 if quick else 7)
    args = ap.parse_args(argv or [])
    model_dir = resolve_model_dir()
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    vocab = read_config(model_dir).vocab_size
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
            emit({"metric": "value_check_us_per_token", "case": name, "tokens": len(tokens),
                  "with_check_us": with_us, "without_check_us": without_us, "extra_us": with_us - without_us})
    finally:
        service.close()
    if extras:
        emit({"metric": "value_check_us_per_token_summary", "cases": len(extras),
              "median_extra_us": statistics.median(extras), "max_extra_us": max(extras)})
