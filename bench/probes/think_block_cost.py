"""`python -m bench.probes.think_block_cost`: what a think block before a grammar costs per token.

A reasoning request's constraint is `ThinkThenConstraint` (grammar/reasoning/sequence.py): the
block's grammar, then the answer's. Prints one JSON line per walk, median µs per token to fill the
mask and accept the token (bench.harness.common.mask_walk_us) on the default model's tokenizer:

- `answer_alone`: the JSON answer under its own matcher (a request without a block);
- `block_then_answer`: a block of free text, `</think>\\n\\n`, then the same answer, through the
  composed matcher (the block's tokens and the answer's together);
- `block_only`: the block's tokens alone (the any-text mask of the block);

and one line for the strict guard's calls inside the block: the median µs of `completion_plan()`
(the way-out search and the answer's plan) and `completion_bound_after()` at each block token.
"""

from __future__ import annotations

import json
import statistics
import time

from bench.harness.common import default_tokenizer, mask_walk_us
from grammar import GrammarService, GrammarSpec
from grammar.reasoning.markers import TO_COME, think_markers, think_tag
from grammar.reasoning.sequence import ThinkThenConstraint

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "Oslo", "Lima"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "note": {"type": "string", "maxLength": 40},
    },
    "required": ["city", "days", "note"],
    "additionalProperties": False,
}
BLOCK = (
    "<think>\nThe traveller wants a short trip. Paris is close and the weather is mild in spring; "
    "three days leave time for the museums and a walk along the river, so that is the plan.\n</think>\n\n"
)
ANSWER = '{"city":"Paris","days":3,"note":"museums and the river"}'
REPS = 20


def main() -> None:
    tokenizer, vocab = default_tokenizer()
    service = GrammarService(tokenizer, vocab)
    try:
        markers = think_markers("qwen_3")

        def encode(text: str) -> list[int]:
            return list(tokenizer.encode(text, add_special_tokens=False))

        think = service.compile(GrammarSpec.of("structural_tag", think_tag(markers, TO_COME), True))
        answer = service.compile(GrammarSpec.of("json_schema", SCHEMA, True))
        both = ThinkThenConstraint(think, answer, markers.begin, markers.end + markers.after, encode)
        block, json_ids = encode(BLOCK), encode(ANSWER)
        words = (vocab + 31) // 32
        walks = {
            "answer_alone": (answer.new_matcher, json_ids),
            "block_then_answer": (both.new_matcher, block + json_ids),
            "block_only": (both.new_matcher, block),
        }
        for name, (new_matcher, tokens) in walks.items():
            us = mask_walk_us(new_matcher, tokens, words, REPS, timed_accept=True)
            print(
                json.dumps(
                    {"metric": "think_block_cost", "walk": name, "tokens": len(tokens), "us_per_token": round(us, 1)}
                )
            )
        plans, bounds = [], []
        matcher = both.new_matcher()
        probe = encode(" idea")[0]
        for token in block[:-1]:
            matcher.accept(token)
            start = time.perf_counter()
            matcher.completion_plan()
            plans.append(time.perf_counter() - start)
            start = time.perf_counter()
            matcher.completion_bound_after(probe)
            bounds.append(time.perf_counter() - start)
        print(
            json.dumps(
                {
                    "metric": "think_block_guard_cost",
                    "block_tokens": len(block),
                    "plan_us_median": round(1e6 * statistics.median(plans), 1),
                    "bound_after_us_median": round(1e6 * statistics.median(bounds), 1),
                }
            )
        )
    finally:
        service.close()


if __name__ == "__main__":
    main()
