"""`python -m bench cache`: the prefix cache on agent-like workloads (in-process engine).

For each workload: hit rate, cold vs warm TTFT, throughput with the cache vs without (same run,
same requests), LPM vs FCFS scheduling, and the share of engine time spent in tree operations.
"""

from __future__ import annotations

import time

from bench.harness.common import emit, run_timed
from bench.harness.workloads import FEW_SHOT, FEW_SHOT_QUESTIONS, USER_TASKS, agent_system_prompt, chat
from runtime.api import GenerateRequest
from runtime.decode.sampling import SamplingParams
from runtime.engine.engine import Engine


def _greedy(n):
    return SamplingParams(max_new_tokens=n, temperature=0.0, ignore_eos=True)


def build_workloads(tok, quick: bool) -> dict[str, dict]:
    """Each workload: `first` (cold request), `warm` (a later request of the same family) and
    `batch` (the request set run concurrently for throughput)."""
    n = 4 if quick else 8
    out_tokens = 8 if quick else 16
    sys_prompt = agent_system_prompt(tok, 1500)
    # An agent fleet sends many tasks against one system prompt + tool set.
    agent = [
        chat(tok, [{"role": "system", "content": sys_prompt}, {"role": "user", "content": u}])
        for u in USER_TASKS[: (n if quick else 16) + 1]
    ]
    # Few-shot prompting: one long block of examples, many questions.
    few = [
        chat(tok, [{"role": "user", "content": FEW_SHOT + f"Q: What is the capital of {c}?\nA:"}])
        for c in FEW_SHOT_QUESTIONS[: (n if quick else 16) + 1]
    ]
    # multi-turn: conversations growing turn by turn; each turn is a request
    turns = []
    for c in range(2 if quick else 4):
        msgs = [{"role": "system", "content": f"You are tutor #{c} for a student learning geography."}]
        for t in range(3 if quick else 4):
            msgs.append({"role": "user", "content": f"Question {t} about country {c * 7 + t}: what is notable there?"})
            turns.append(chat(tok, msgs))
            msgs.append(
                {"role": "assistant", "content": f"Country {c * 7 + t} is notable for rivers, food and history. " * 3}
            )
    sc_q = chat(
        tok, [{"role": "user", "content": FEW_SHOT + "Q: What is the capital of Australia? Think step by step.\nA:"}]
    )
    tot_base = FEW_SHOT + "Problem: plan a 3-day trip. Thought 1:"
    tot = [
        chat(tok, [{"role": "user", "content": tot_base + f" option {a}. Thought 2: variant {b}."}])
        for a in range(2 if quick else 3)
        for b in range(2 if quick else 3)
    ]
    cold = [
        chat(
            tok,
            [
                {
                    "role": "user",
                    "content": f"Unique request {i}: describe the number {i * 7919} in "
                    f"{['French', 'Spanish', 'German', 'Italian'][i % 4]} words.",
                }
            ],
        )
        for i in range(n + 1)
    ]

    def family(reqs):
        return {"first": reqs[0], "warm": reqs[1], "batch": reqs[1:], "temperature": 0.0}

    w = {
        "few-shot": family(few),
        "multi-turn": {"first": turns[0], "warm": turns[1], "batch": turns, "temperature": 0.0},
        "agent-tools": family(agent),
        "self-consistency": {"first": sc_q, "warm": sc_q, "batch": [sc_q] * 8, "temperature": 0.7},
        "tree-of-thought": family(tot),
        "cold-unique": family(cold),
    }
    for v in w.values():
        v["out_tokens"] = out_tokens
    return w


def _throughput(engine: Engine, wl: dict, flush: bool = True) -> tuple[float, dict]:
    if flush:
        engine.flush_cache()
    specs = [
        GenerateRequest(
            p, SamplingParams(max_new_tokens=wl["out_tokens"], temperature=wl["temperature"], seed=i, ignore_eos=True)
        )
        for i, p in enumerate(wl["batch"])
    ]
    t0 = time.perf_counter()
    run_timed(engine, specs)
    elapsed = time.perf_counter() - t0
    return len(specs) / elapsed, engine.stats()


def _ttft(engine: Engine, wl: dict) -> tuple[float, float, dict]:
    engine.flush_cache()
    cold = run_timed(engine, [GenerateRequest(wl["first"], _greedy(2))])[0].ttft
    warm = run_timed(engine, [GenerateRequest(wl["warm"], _greedy(2))])[0].ttft
    return cold, warm, engine.stats()


def run(quick: bool = False, argv=None) -> None:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m bench cache")
    ap.add_argument("--workload", action="append", help="run only these workloads (repeatable)")
    args = ap.parse_args(argv or [])
    common = dict(kv_pool_tokens=32768, chunked_prefill_tokens=512)
    lpm = Engine(schedule_policy="lpm", **common).start()
    workloads = build_workloads(lpm.tokenizer, quick)
    if args.workload:
        unknown = set(args.workload) - set(workloads)
        if unknown:
            raise SystemExit(f"unknown workload(s): {', '.join(sorted(unknown))}; choose from {', '.join(workloads)}")
        workloads = {k: v for k, v in workloads.items() if k in args.workload}
    warmup = next(iter(workloads.values()))["first"]
    run_timed(lpm, [GenerateRequest(warmup, _greedy(2))])  # warm-up
    results = {}
    for name, wl in workloads.items():
        cold, warm, _ = _ttft(lpm, wl)
        # Hit rate over the whole stream (cold request, warm request, then the batch), as an agent
        # fleet sees it: only the very first request of a family misses.
        _, stream_stats = _throughput(lpm, wl, flush=False)
        cached = stream_stats.cached_prompt_tokens
        prompt = stream_stats.prompt_tokens
        tput_lpm, stats = _throughput(lpm, wl)  # throughput from a cold cache, like the no-cache run
        results[name] = dict(cold=cold, warm=warm, tput=tput_lpm, stats=stats, hit_rate=cached / max(1, prompt))
    lpm.shutdown()
    for label, cfg in (("nocache", dict(radix_cache=False)), ("fcfs", dict(schedule_policy="fcfs"))):
        e = Engine(**common, **cfg).start()
        run_timed(e, [GenerateRequest(warmup, _greedy(2))])
        for name, wl in workloads.items():
            results[name][label] = _throughput(e, wl)[0]
        e.shutdown()
    for name, r in results.items():
        s = r["stats"]
        emit(
            {
                "bench": "cache",
                "workload": name,
                "requests": len(workloads[name]["batch"]),
                "hit_rate": r["hit_rate"],
                "cold_ttft_s": r["cold"],
                "warm_ttft_s": r["warm"],
                "ttft_speedup": r["cold"] / r["warm"],
                "throughput_req_s": r["tput"],
                "throughput_vs_nocache": r["tput"] / r["nocache"],
                "lpm_vs_fcfs": r["tput"] / r["fcfs"],
                "tree_overhead_frac": s.tree_seconds / max(1e-9, s.engine_seconds),
            }
        )
