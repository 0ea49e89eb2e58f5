"""`python -m bench.closing_plan_cost`: what a completion plan costs on a large strict schema.

The schema is the 48-required-property, three-level one of tests/test_completeness_large.py. Prints
one JSON line: the smallest instance's plan length, the median and max time of `completion_plan()`
from every state along that plan (the guard replans every 16 tokens far from the budget and every
token near it), and one `completion_bound_after` (the budget check of an expanding token).
"""

from __future__ import annotations

import json
import statistics
import time

from bench.common import default_tokenizer
from grammar import GrammarService, GrammarSpec
from tests.test_completeness_large import large_schema


def main() -> None:
    tokenizer, vocab = default_tokenizer()
    service = GrammarService(tokenizer, vocab)
    handle = service.compile(GrammarSpec.json_schema(large_schema()))
    matcher = handle.new_matcher()
    plan = matcher.completion_plan()
    times = []
    for token in plan[:-1]:
        start = time.perf_counter()
        matcher.completion_plan()
        times.append(time.perf_counter() - start)
        matcher.accept(token)
    probe = handle.new_matcher()
    for token in tokenizer.encode('{"record_identifier":"r1', add_special_tokens=False):
        probe.accept(token)
    start = time.perf_counter()
    probe.completion_bound_after(tokenizer.convert_tokens_to_ids('","'))
    after_ms = 1000 * (time.perf_counter() - start)
    print(json.dumps({"metric": "closing_plan_cost", "plan_tokens": len(plan),
                      "plan_ms_median": round(1000 * statistics.median(times), 1),
                      "plan_ms_max": round(1000 * max(times), 1), "bound_after_ms": round(after_ms, 1)}))
    service.close()


if __name__ == "__main__":
    main()
