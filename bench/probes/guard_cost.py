"""`python -m bench.probes.guard_cost`: what the strict guard's budget checks cost on a large schema.

Since the fix for cut-off strict outputs (runtime/decode/completeness.py), every token that may expand the
output is checked against the budget (`completion_bound_after`, a fork and a plan) whenever the
budget left is within FAR_TOKENS; before, only within 2 x bound + CHECK_SLACK. This runs the real
engine on the 48-required-property schema of tests/runtime/decode/test_completeness_large.py (strict, greedy,
`max_tokens` 384, two requests at once) under both rules, alternated, and prints one JSON line per
run: wall seconds, completion tokens, finish reasons, and whether each output validates.
"""

from __future__ import annotations

import json
import time

import jsonschema

import runtime.decode.completeness as completeness
from bench.harness.common import default_tokenizer
from grammar import GrammarService, GrammarSpec
from runtime.api import GenerateRequest
from runtime.decode.sampling import SamplingParams
from runtime.engine.engine import Engine
from tests.runtime.decode.test_completeness_large import PROFILE, SYSTEM, large_schema

CURRENT = completeness.CompletionGuard.allows


def unchecked_far_from_the_budget(self, matcher, token_id: int, remaining: int) -> bool:
    """The rule before the fix: far from the budget relative to the bound, no check."""
    if self.bound is not None and not self.closing and remaining > 2 * self.bound + completeness.CHECK_SLACK:
        return True
    return CURRENT(self, matcher, token_id, remaining)


def main(rounds: int = 2, batch: int = 2) -> None:
    engine = Engine(kv_pool_tokens=16384).start()
    tok = engine.tokenizer
    service = GrammarService(*default_tokenizer())
    schema = large_schema()
    handle = service.compile(GrammarSpec.json_schema(schema))
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": PROFILE}]
    out = tok.apply_chat_template(msgs, add_generation_prompt=True)
    ids = list(out["input_ids"] if hasattr(out, "keys") else out)

    def run() -> tuple[float, list]:
        specs = [
            GenerateRequest(ids, SamplingParams(max_new_tokens=384, temperature=0.0), constraint=handle, strict=True)
            for _ in range(batch)
        ]
        start = time.perf_counter()
        results = engine.generate_many(specs, timeout=900)
        return time.perf_counter() - start, results

    def valid(text: str) -> bool:
        try:
            jsonschema.validate(json.loads(text), schema)
            return True
        except (ValueError, jsonschema.ValidationError):
            return False

    try:
        run()  # warm-up: compile caches, kernels
        for _ in range(rounds):
            for name, rule in (
                ("checked_within_far_tokens", CURRENT),
                ("before_the_fix", unchecked_far_from_the_budget),
            ):
                completeness.CompletionGuard.allows = rule
                seconds, results = run()
                print(
                    json.dumps(
                        {
                            "bench": "guard_cost",
                            "rule": name,
                            "wall_s": round(seconds, 3),
                            "completion_tokens": [r.completion_tokens for r in results],
                            "finish": [r.finish_reason for r in results],
                            "valid": [valid(r.text) for r in results],
                        }
                    ),
                    flush=True,
                )
    finally:
        completeness.CompletionGuard.allows = CURRENT
        engine.shutdown()
        service.close()


if __name__ == "__main__":
    main()
