"""`python -m bench.probes.closing_plan_cost`: what a completion plan costs on a large strict schema.

The schema is the 48-required-property, three-level one of tests/runtime/decode/test_completeness_large.py. Prints
one JSON line per engine (xgrammar, then llguidance on the same schema, both through
grammar/checks/closing.py's planner): the smallest instance's plan length, the median and max time of
`completion_plan()` from every state along that plan (the guard replans every 16 tokens far from
the budget and every token near it), one `completion_bound_after` (the budget check of an
expanding token), and the median plain mask along the same path (what every constrained token
costs, strict or not), for scale.
"""

from __future__ import annotations

import json
import statistics
import time
from typing import Callable

import torch
import xgrammar as xgr

from bench.harness.common import default_tokenizer
from grammar.checks.closing import ClosingVocab
from grammar.engines.llguidance.matcher import LLGuidanceMatcher, compile_llguidance
from grammar.engines.llguidance.schema import llguidance_grammar
from grammar.engines.llguidance.tokenizer import LLGuidanceTokenizer
from grammar.engines.xgrammar.matcher import XGrammarMatcher
from grammar.engines.xgrammar.schema import compact_json_grammar
from grammar.engines.xgrammar.tokenizer import build_tokenizer_info, special_token_ids
from tests.runtime.decode.test_completeness_large import large_schema


def measure(engine: str, new_matcher: Callable, tokenizer, vocab: int) -> dict:
    matcher = new_matcher()
    plan = matcher.completion_plan()
    mask = torch.full((1, (vocab + 31) // 32), -1, dtype=torch.int32)
    times, masks = [], []
    for token in plan[:-1]:
        start = time.perf_counter()
        matcher.completion_plan()
        times.append(time.perf_counter() - start)
        start = time.perf_counter()
        matcher.fill_bitmask(mask, 0)
        masks.append(time.perf_counter() - start)
        matcher.accept(token)
    probe = new_matcher()
    for token in tokenizer.encode('{"record_identifier":"r1', add_special_tokens=False):
        probe.accept(token)
    start = time.perf_counter()
    probe.completion_bound_after(tokenizer.convert_tokens_to_ids('","'))
    after_ms = 1000 * (time.perf_counter() - start)
    return {
        "metric": "closing_plan_cost",
        "engine": engine,
        "plan_tokens": len(plan),
        "plan_ms_median": round(1000 * statistics.median(times), 1),
        "plan_ms_max": round(1000 * max(times), 1),
        "bound_after_ms": round(after_ms, 1),
        "mask_us_median": round(1e6 * statistics.median(masks), 1),
    }


def main() -> None:
    tokenizer, vocab = default_tokenizer()
    stop_ids = [tokenizer.eos_token_id]
    special = frozenset(special_token_ids(tokenizer))
    closing = ClosingVocab(tokenizer, vocab, stop_ids, special)

    def encode(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    schema = large_schema()
    compiler = xgr.GrammarCompiler(build_tokenizer_info(tokenizer, vocab, stop_ids), cache_enabled=False)
    compiled = compiler.compile_grammar(compact_json_grammar(schema, strict=True))
    print(
        json.dumps(measure("xgrammar", lambda: XGrammarMatcher(compiled, encode, special, closing), tokenizer, vocab))
    )
    llg_tokenizer = LLGuidanceTokenizer(tokenizer, vocab, stop_ids).get()
    start = compile_llguidance(llg_tokenizer, llguidance_grammar(schema, strict=True), "JSON schema", None)
    print(
        json.dumps(
            measure(
                "llguidance",
                lambda: LLGuidanceMatcher(start, frozenset(stop_ids), None, closing, encode),
                tokenizer,
                vocab,
            )
        )
    )


if __name__ == "__main__":
    main()
