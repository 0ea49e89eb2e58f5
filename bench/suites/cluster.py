"""`python -m bench cluster`: prefix-aware vs round-robin vs power-of-two routing over 2 replicas.

The case routing exists for: each replica's KV pool holds about half of the workload's distinct
system+tools prefixes (together they hold all, alone each thrashes), and requests for 4 prefixes
arrive interleaved in a seeded random order. Each policy runs on a fresh deployment (fresh
replicas, empty caches). Prints one JSON line per policy (prompt hit rate, TTFT p50/p90, req/s,
largest replica share) and one comparing prefix-aware with round-robin.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time

from bench.harness.common import emit
from bench.harness.workloads import USER_TASKS, agent_system_prompt, chat
from gateway.cluster.client import ClusterEngineClient
from gateway.cluster.launch import start_replicas, stop_replicas
from gateway.cluster.routing_log import ROUTING_LOG
from gateway.cluster.settings import ClusterSettings
from grammar.settings import GrammarSettings
from runtime.api import GenerateRequest
from runtime.decode.sampling import SamplingParams
from runtime.engine_config import EngineConfig


def workload(tokenizer, prefixes: int, prefix_tokens: int, requests: int, seed: int) -> list[list[int]]:
    systems = [agent_system_prompt(tokenizer, prefix_tokens, variant=v) for v in range(prefixes)]
    rng = random.Random(seed)
    return [
        chat(
            tokenizer,
            [
                {"role": "system", "content": systems[rng.randrange(prefixes)]},
                {"role": "user", "content": USER_TASKS[i % len(USER_TASKS)]},
            ],
        )
        for i in range(requests)
    ]


async def drive(client: ClusterEngineClient, prompts: list[list[int]], concurrency: int, max_new_tokens: int):
    gate = asyncio.Semaphore(concurrency)
    results = []

    async def one(ids: list[int]) -> None:
        async with gate:
            started = time.perf_counter()
            first = None
            req = GenerateRequest(prompt_ids=ids, sampling=SamplingParams(max_new_tokens=max_new_tokens, temperature=0))
            async for event in client.submit(req):
                if first is None and (event.token_ids or event.finished):
                    first = time.perf_counter() - started
                last = event
            results.append((first, last.prompt_tokens, last.cached_tokens))

    started = time.perf_counter()
    await asyncio.gather(*(one(ids) for ids in prompts))
    return results, time.perf_counter() - started


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run_policy(policy: str, engine: EngineConfig, prompts: list[list[int]], args) -> dict:
    cluster = ClusterSettings(
        replicas=2, replica_cpus=args.replica_cpus, routing_policy=policy, routing_stats_period_s=1.0
    )
    app_name = f"jumpgate-bench-{policy}"  # its own deployment: a fresh router with this policy
    handle = start_replicas(engine, GrammarSettings(disk_cache=False), cluster, app_name=app_name)
    try:
        client = ClusterEngineClient(handle, engine, 2)
        ROUTING_LOG.reset()
        results, wall = asyncio.run(drive(client, prompts, args.concurrency, args.max_new_tokens))
        decisions, _ = ROUTING_LOG.snapshot()
    finally:
        stop_replicas(app_name)
    per_replica: dict[str, int] = {}
    for (replica, _), n in decisions.items():
        per_replica[replica] = per_replica.get(replica, 0) + n
    ttfts = [r[0] for r in results]
    prompt = sum(r[1] for r in results)
    return {
        "bench": "cluster",
        "policy": policy,
        "requests": len(results),
        "prompt_hit_rate": sum(r[2] for r in results) / prompt if prompt else 0.0,
        "ttft_p50_s": statistics.median(ttfts),
        "ttft_p90_s": percentile(ttfts, 0.9),
        "req_per_s": len(results) / wall,
        "max_replica_share": max(per_replica.values()) / sum(per_replica.values()) if per_replica else 0.0,
        "by_reason": {
            reason: sum(n for (_, r), n in decisions.items() if r == reason)
            for reason in sorted({r for _, r in decisions})
        },
    }


def run(quick: bool = False, argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench cluster")
    ap.add_argument("--prefixes", type=int, default=4)
    ap.add_argument("--prefix-tokens", type=int, default=300 if quick else 800)
    ap.add_argument("--requests", type=int, default=24 if quick else 64)
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=4 if quick else 16)
    ap.add_argument("--replica-cpus", type=float, default=0.5)
    ap.add_argument("--policies", default="prefix,round_robin,power_of_two")
    args = ap.parse_args(argv or [])

    import ray
    from ray import serve

    from runtime.model.loader import load_tokenizer, resolve_model_dir

    tokenizer = load_tokenizer(resolve_model_dir())
    prompts = workload(tokenizer, args.prefixes, args.prefix_tokens, args.requests, seed=0)
    prefix_len = max(len(p) for p in prompts)
    # about half of the distinct prefixes per replica, plus room for the requests in flight
    pool = int(prefix_len * args.prefixes / 2) + args.concurrency * (64 + args.max_new_tokens)
    engine = EngineConfig(kv_pool_tokens=pool, num_threads=1, max_running_requests=4, max_waiting_requests=64)
    emit(
        {
            "bench": "cluster",
            "setup": True,
            "kv_pool_tokens_per_replica": pool,
            "prompt_tokens_max": prefix_len,
            "prefixes": args.prefixes,
            "requests": len(prompts),
        }
    )
    rows = {}
    try:
        for policy in args.policies.split(","):
            rows[policy] = run_policy(policy, engine, prompts, args)
            emit(rows[policy])
    finally:
        serve.shutdown()
        ray.shutdown()
    if "prefix" in rows and "round_robin" in rows:
        p, rr = rows["prefix"], rows["round_robin"]
        emit(
            {
                "bench": "cluster",
                "compare": "prefix/round_robin",
                "hit_rate_ratio": p["prompt_hit_rate"] / rr["prompt_hit_rate"] if rr["prompt_hit_rate"] else None,
                "ttft_p50_ratio": p["ttft_p50_s"] / rr["ttft_p50_s"] if rr["ttft_p50_s"] else None,
            }
        )
