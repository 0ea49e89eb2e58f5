"""`python -m bench grammar_engines`: token-mask time per constrained token, xgrammar vs llguidance.

For every corpus schema that both engines compile (tests/data/schema_corpus, with a valid example
instance in schema_corpus_examples.json), both matchers walk the same token sequence (the compact
JSON of the example, as the tokenizer encodes it): at each position the mask is filled into a row
of an int32 [1, ceil(vocab/32)] tensor (timed), then the token is accepted. One JSON line per
schema (median microseconds per token over the repetitions, each on a fresh matcher after one
untimed warm-up pass), then a summary line with the median and the worst llguidance/xgrammar ratio.

llguidance runs twice, side by side, through matchers of one `LLGuidanceHandle` as the server
makes them: encoding forced text through grammar/engines/llguidance/tokenizer.py's memo (which the warm-up pass
fills, as a schema's earlier requests would), and with llguidance's own uncached tokenizer
(`llguidance_uncached_us`). Both share the handle's start-state mask, as the server's requests do.

  python -m bench grammar_engines [--quick] [--reps N]
"""

from __future__ import annotations

import argparse
import json
import statistics

import xgrammar as xgr

from bench.harness.common import default_tokenizer, emit, mask_walk_us
from bench.harness.workloads import corpus_examples
from grammar.engines.llguidance.matcher import LLGuidanceHandle, compile_llguidance
from grammar.engines.llguidance.schema import llguidance_grammar, llguidance_refusal
from grammar.engines.llguidance.tokenizer import LLGuidanceTokenizer
from grammar.engines.xgrammar.matcher import XGrammarMatcher
from grammar.engines.xgrammar.schema import compact_json_grammar
from grammar.engines.xgrammar.tokenizer import build_tokenizer_info


def load_cases(quick: bool) -> list[tuple[str, dict, str]]:
    """(name, schema, compact JSON of a valid example) for the corpus schemas both engines take."""
    cases = [
        (name, schema, json.dumps(value, separators=(",", ":"), ensure_ascii=False))
        for name, schema, value in corpus_examples()
        if llguidance_refusal(schema, strict=True) is None
    ]
    return cases[:8] if quick else cases


class MaskTimer:
    """Both engines' compilers for the default model's tokenizer, to time their masks along a text
    (also used by bench/suites/structured/fidelity.py on the model's own answers)."""

    def __init__(self):
        self.tokenizer, vocab = default_tokenizer()
        self.stop_ids = [self.tokenizer.eos_token_id]
        self.xgr_compiler = xgr.GrammarCompiler(
            build_tokenizer_info(self.tokenizer, vocab, self.stop_ids), cache_enabled=False
        )
        self.llg_tokenizer = LLGuidanceTokenizer(self.tokenizer, vocab, self.stop_ids).get()
        self.llg_uncached = LLGuidanceTokenizer(self.tokenizer, vocab, self.stop_ids, entries=0).get()
        self.words = (vocab + 31) // 32

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def xgrammar_us(self, schema: dict, text: str, reps: int) -> float | None:
        """Median µs per token of XGrammar's mask for `schema` (strict) along `text` + the stop token."""
        compiled = self.xgr_compiler.compile_grammar(compact_json_grammar(schema, strict=True))
        return mask_walk_us(
            lambda: XGrammarMatcher(compiled, self.encode, frozenset()),
            self.encode(text) + self.stop_ids,
            self.words,
            reps,
        )

    def llguidance_us(self, schema: dict, text: str, reps: int, cached: bool = True) -> float | None:
        """The same with llguidance's matcher (`cached`: encoding forced text through the memo)."""
        tokenizer = self.llg_tokenizer if cached else self.llg_uncached
        grammar = llguidance_grammar(schema, strict=True)
        handle = LLGuidanceHandle(
            "bench",
            "json_schema",
            grammar,
            compile_llguidance(tokenizer, grammar, "JSON schema", None),
            frozenset(self.stop_ids),
        )
        return mask_walk_us(handle.new_matcher, self.encode(text) + self.stop_ids, self.words, reps)


def run(quick: bool = False, argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench grammar_engines")
    ap.add_argument("--reps", type=int, default=3 if quick else 7)
    args = ap.parse_args(argv or [])
    timer = MaskTimer()
    ratios, uncached_ratios = [], []
    for name, schema, text in load_cases(quick):
        xgr_us = timer.xgrammar_us(schema, text, args.reps)
        llg_us = timer.llguidance_us(schema, text, args.reps)
        uncached_us = timer.llguidance_us(schema, text, args.reps, cached=False)
        record = {
            "metric": "mask_us_per_token",
            "schema": name,
            "tokens": len(timer.encode(text)) + 1,
            "xgrammar_us": xgr_us,
            "llguidance_us": llg_us,
            "llguidance_uncached_us": uncached_us,
        }
        if xgr_us and llg_us and uncached_us:
            record["llguidance_over_xgrammar"] = llg_us / xgr_us
            record["uncached_over_xgrammar"] = uncached_us / xgr_us
            ratios.append(llg_us / xgr_us)
            uncached_ratios.append(uncached_us / xgr_us)
        emit(record)
    if ratios:
        emit(
            {
                "metric": "mask_us_per_token_summary",
                "schemas": len(ratios),
                "median_llguidance_over_xgrammar": statistics.median(ratios),
                "max_llguidance_over_xgrammar": max(ratios),
                "schemas_within_2x": sum(r <= 2.0 for r in ratios),
                "median_uncached_over_xgrammar": statistics.median(uncached_ratios),
                "uncached_schemas_within_2x": sum(r <= 2.0 for r in uncached_ratios),
            }
        )
