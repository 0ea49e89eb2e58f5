"""`python -m bench.probes.logprobs_overhead`: what asking for logprobs costs the engine.

The same greedy decode batch (8 chat prompts x 32 tokens, SmolLM2 in-process) without logprobs,
with logprobs and no alternatives, and with 20 alternatives; alternating runs, best of each.
Prints one JSON line per setting: seconds and output tokens per second.
"""

from __future__ import annotations

import time

from bench.harness.common import emit
from bench.harness.workloads import chat
from runtime.api import GenerateRequest
from runtime.decode.sampling import SamplingParams
from runtime.engine.engine import Engine

QUESTIONS = [
    "Tell me a joke.",
    "What is 2+2?",
    "Name three colors.",
    "Write a haiku about rain.",
    "Who wrote Hamlet?",
    "Explain gravity briefly.",
    "Describe a cat.",
    "Why is the sky blue?",
]
SETTINGS = {"off": None, "logprobs": 0, "top_logprobs_20": 20}
NEW_TOKENS = 32
ROUNDS = 3


def main() -> None:
    with Engine(kv_pool_tokens=8192) as engine:
        prompts = [chat(engine.tokenizer, [{"role": "user", "content": q}]) for q in QUESTIONS]

        def run(count: int | None) -> float:
            specs = [
                GenerateRequest(
                    p, SamplingParams(max_new_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True, logprobs=count)
                )
                for p in prompts
            ]
            engine.flush_cache()  # every run prefills the same prompts
            t0 = time.perf_counter()
            engine.generate_many(specs, timeout=600)
            return time.perf_counter() - t0

        run(None)  # warm-up
        best = {name: float("inf") for name in SETTINGS}
        for _ in range(ROUNDS):
            for name, count in SETTINGS.items():
                best[name] = min(best[name], run(count))
        for name, seconds in best.items():
            emit({"setting": name, "seconds": seconds, "output_tokens_per_s": len(prompts) * NEW_TOKENS / seconds})


if __name__ == "__main__":
    main()
