"""`python -m bench.probes.closing_plan_cost`: what a completion plan costs on a large strict schema.

The schema is the 48-required-property, three-level one of tests/runtime/decode/test_completeness_large.py. Prints
one JSON line per engine (xgrammar, then llguidance on the same schema, both through
grammar/checks/closing.py's planner): the smallest instance's plan length, the median and max time of
`completion_plan()` from every state along that plan (the guard replans every 16 tokens far from
the budget and every token near it), one `completion_bound_after` (the budget check of an
expanding token), and the median plain mask along the same path (what every constrained token
costs, strict or not), for scale.

`--guard-replay [--budgets 100,160] [--rounds 5] [--trace FILE]`: the strict guard's host time per
token on a fixed output, and its decisions, without a model.

Replays one 12-field extraction record (tests/data/schema_corpus/extract_12_fields.json, compact
JSON) through a strict matcher and runtime/decode/completeness.py's guard as the decoder drives them
(before_choice, the mask, allows, accept, after_token); where the guard refuses the record's next
token it follows the guard's fallback (the plan) to the end, so small budgets exercise closing. One
JSON line per budget: tokens, the median process CPU seconds of a request over `--rounds` fresh
matchers, and ms per token. `--trace FILE` writes every step's token, mask bit, verdict, closing,
tightness, bound, plan and check point: two commits' files must be equal (the greedy outputs'
exactness for this output). Run from a checkout (or with it first on PYTHONPATH) to measure it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import torch
import xgrammar as xgr

from bench.harness.common import default_tokenizer, git_commit
from grammar import GrammarService, GrammarSpec
from grammar.checks.closing import ClosingVocab
from grammar.engines.llguidance.matcher import LLGuidanceMatcher, compile_llguidance
from grammar.engines.llguidance.schema import llguidance_grammar
from grammar.engines.llguidance.tokenizer import LLGuidanceTokenizer
from grammar.engines.xgrammar.matcher import XGrammarMatcher
from grammar.engines.xgrammar.schema import compact_json_grammar
from grammar.engines.xgrammar.tokenizer import build_tokenizer_info, special_token_ids
from runtime.decode.completeness import TEXT_TAIL, CompletionGuard
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


EXTRACT = Path(__file__).resolve().parents[2] / "tests" / "data" / "schema_corpus" / "extract_12_fields.json"
RECORD = {
    "full_name": "Maria Lopez Fernandez",
    "job_title": "Senior Data Engineer",
    "company_name": "Northwind Analytics",
    "company_industry": "Software",
    "company_website": "https://northwind.example.com",
    "headquarters_city": "Seattle",
    "email": "maria.lopez@northwind.example.com",
    "phone": "+1 206 555 0142",
    "skills": ["Python", "Spark", "SQL", "Airflow"],
    "languages": ["English", "Spanish"],
    "previous_employers": ["Contoso", "Fabrikam"],
    "summary": "Builds data pipelines.",
}


def replay(handle, tokenizer, vocab: int, ids: list[int], budget: int, trace: list | None = None) -> list[int]:
    matcher, guard = handle.new_matcher(), CompletionGuard()
    mask = torch.full((1, (vocab + 31) // 32), -1, dtype=torch.int32)
    out: list[int] = []
    text, following = "", True
    while len(out) < budget and not matcher.is_terminated():
        token = ids[len(out)] if following and len(out) < len(ids) else None
        guard.before_choice(matcher, len(out), budget)
        guard.fill_mask(matcher, mask, 0)
        bit = token is not None and bool((int(mask[0, token >> 5]) >> (token & 31)) & 1)
        ok = bit and guard.allows(matcher, token, budget - len(out))
        if not ok:
            following, token = False, guard.fallback_token(matcher)
            if token is None:
                break
        if trace is not None:
            plan = None if guard.plan is None else list(guard.plan)
            trace.append([len(out), token, bit, ok, guard.closing, guard.tight, guard.bound, plan, guard.checked_at])
        if not matcher.accept(token):
            break
        out.append(token)
        text += tokenizer.decode([token])
        guard.after_token(out, text[-TEXT_TAIL:], matcher.closes_value(token))
    return out


def guard_replay_main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.probes.closing_plan_cost --guard-replay")
    ap.add_argument("--budgets", default="30,45,60,80,100,130,160")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--trace", default=None, help="write every step's decisions here (JSON)")
    args = ap.parse_args(argv)
    tokenizer, vocab = default_tokenizer()
    service = GrammarService(tokenizer, vocab)
    try:
        handle = service.compile(GrammarSpec.json_schema(json.loads(EXTRACT.read_text())))
        ids = tokenizer.encode(json.dumps(RECORD, separators=(",", ":")), add_special_tokens=False)
        traces = {}
        for budget in [int(b) for b in args.budgets.split(",")]:
            replay(handle, tokenizer, vocab, ids, budget)  # warm-up
            seconds = []
            for _ in range(args.rounds):
                start = time.process_time()
                out = replay(handle, tokenizer, vocab, ids, budget)
                seconds.append(time.process_time() - start)
            cpu = statistics.median(seconds)
            traces[budget] = []
            replay(handle, tokenizer, vocab, ids, budget, traces[budget])
            line = {"probe": "guard_replay", "commit": git_commit(), "budget": budget, "tokens": len(out)}
            line.update(cpu_s_median=round(cpu, 4), ms_per_token=round(1000 * cpu / len(out), 3))
            print(json.dumps(line), flush=True)
        if args.trace:
            with open(args.trace, "w") as f:
                json.dump(traces, f)
    finally:
        service.close()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--guard-replay"]:
        guard_replay_main(sys.argv[2:])
    else:
        main()
