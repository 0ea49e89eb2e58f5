"""`python -m bench grammar_engines`: token-mask time per constrained token, xgrammar vs llguidance.

For every corpus schema that both engines compile (tests/data/schema_corpus, with a valid example
instance in schema_corpus_examples.json), both matchers walk the same token sequence (the compact
JSON of the example, as the tokenizer encodes it): at each position the mask is filled into a row
of an int32 [1, ceil(vocab/32)] tensor (timed), then the token is accepted. One JSON line per
schema (median microseconds per token over the repetitions, each on a fresh matcher after one
untimed warm-up pass), then a summary line with the median and the worst llguidance/xgrammar ratio.

  python -m bench grammar_engines [--quick] [--reps N]
"""

from __future__ import annotations

import argparse
import json
import statistics

import xgrammar as xgr

from bench.common import default_tokenizer, emit, mask_walk_us
from bench.workloads import corpus_examples
from grammar.compact_json import compact_json_grammar
from grammar.llg_matcher import LLGuidanceMatcher, LLGuidanceTokenizer, compile_llguidance
from grammar.llg_schema import llguidance_grammar, llguidance_refusal
from grammar.matcher import XGrammarMatcher
from grammar.tokenizer_info import build_tokenizer_info

def load_cases(quick: bool) -> list[tuple[str, dict, str]]:
    """(name, schema, compact JSON of a valid example) for the corpus schemas both engines take."""
    cases = [(name, schema, json.dumps(value, separators=(",", ":"), ensure_ascii=False))
             for name, schema, value in corpus_examples() if llguidance_refusal(schema, strict=True) is None]
    return cases[:8] if quick else cases


def run(quick: bool = False, argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench grammar_engines")
    ap.add_argument("--reps", type=int, default=3 if quick else 7)
    args = ap.parse_args(argv or [])
    tokenizer, vocab = default_tokenizer()
    stop_ids = [tokenizer.eos_token_id]
    xgr_compiler = xgr.GrammarCompiler(build_tokenizer_info(tokenizer, vocab, stop_ids), cache_enabled=False)
    llg_tokenizer = LLGuidanceTokenizer(tokenizer, vocab, stop_ids).get()
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    words = (vocab + 31) // 32
    ratios = []
    for name, schema, text in load_cases(quick):
        tokens = encode(text) + stop_ids
        compiled = xgr_compiler.compile_grammar(compact_json_grammar(schema, strict=True))
        start = compile_llguidance(llg_tokenizer, llguidance_grammar(schema, strict=True), "JSON schema", None)
        xgr_us = mask_walk_us(lambda: XGrammarMatcher(compiled, encode, frozenset()), tokens, words, args.reps)
        llg_us = mask_walk_us(lambda: LLGuidanceMatcher(start, frozenset(stop_ids)), tokens, words, args.reps)
        record = {"metric": "mask_us_per_token", "schema": name, "tokens": len(tokens),
                  "xgrammar_us": xgr_us, "llguidance_us": llg_us}
        if xgr_us and llg_us:
            record["llguidance_over_xgrammar"] = llg_us / xgr_us
            ratios.append(llg_us / xgr_us)
        emit(record)
    if ratios:
        emit({"metric": "mask_us_per_token_summary", "schemas": len(ratios),
              "median_llguidance_over_xgrammar": statistics.median(ratios),
              "max_llguidance_over_xgrammar": max(ratios),
              "schemas_within_2x": sum(r <= 2.0 for r in ratios)})
