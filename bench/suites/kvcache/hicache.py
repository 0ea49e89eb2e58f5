"""`python -m bench hicache`: the hierarchical KV cache (device → host → disk) on a working set
about 4x the device pool, with the real SmolLM2.

Workload: `prefixes` distinct ~1k-token agent system prompts (`agent_system_prompt(variant=i)`),
revisited in `rounds` rounds (the revisits in a shuffled order), one request at a time, each round with a new user task (so only
the system prompt prefix can be reused). The same request stream runs on two engines in one
process, request by request in turn (so other load on a shared machine hits both alike):
* an engine with only the device cache (L1, the default engine) and
* an engine with the same device pool plus a host pool of 2x it and a disk folder (L1+L2+L3).
Then the tiered engine is shut down and a new one started on the same disk folder ("restart"):
the TTFT of a request whose prefix is on disk (L3 warm) against one whose prefix is not (cold).

One JSON line: `l1_only_hit_rate` / `tiered_hit_rate` (cached prompt tokens / prompt tokens over
the revisit rounds, i.e. after round 1 filled the cache; `*_hit_rate_all_rounds` counts round 1
too), `throughput_vs_l1_only` (requests per busy second over all rounds, round 1 included), and
`restart_ttft_speedup` (cold TTFT / L3-warm TTFT after the restart). Page files written moments
before are read back from the OS page cache, so "disk" reads here run at memory speed.

`python -m bench hicache --eviction`: the cost of one eviction in the tree alone (no model),
for the one-tier `RadixCache` and the tiered `HiRadixCache` (demotion to a host pool), on trees of
growing size: one JSON line per (cache, leaves) with the microseconds per `evict(page)` call and
the LRU queue entries each call looked at. Flat in the number of leaves: no call scans the tree.
"""

from __future__ import annotations

import argparse
import random
import shutil
import tempfile
import time

from bench.harness.common import emit, run_timed
from bench.harness.workloads import USER_TASKS, agent_system_prompt, chat
from runtime.api import GenerateRequest
from runtime.decode.sampling import SamplingParams
from runtime.engine.engine import Engine
from runtime.kvcache.hiradix_cache import HiRadixCache
from runtime.kvcache.pool import KVPool
from runtime.kvcache.radix_cache import RadixCache
from runtime.kvcache.tiers.host_pool import HostKVPool
from runtime.model.loader import load_tokenizer, resolve_model_dir

OUT_TOKENS = 8


def _greedy(n: int = OUT_TOKENS) -> SamplingParams:
    return SamplingParams(max_new_tokens=n, temperature=0.0, ignore_eos=True)


def _interleaved(engines: dict[str, Engine], rounds: list[list[list[int]]]) -> dict[str, dict]:
    """Send each request of each round to every engine in turn (alternating which goes first), so
    load from other processes on a shared machine hits both configurations alike. Per engine:
    busy time, requests, hit rate over the revisit rounds and over all rounds."""
    names = list(engines)
    acc = {n: {"busy_s": 0.0, "requests": 0, "rounds": []} for n in names}
    for r, prompts in enumerate(rounds):
        for n in names:
            acc[n]["rounds"].append([0, 0])
        for i, p in enumerate(prompts):
            order = names if (r + i) % 2 == 0 else names[::-1]
            for n in order:
                tl = run_timed(engines[n], [GenerateRequest(p, _greedy())])[0]
                a = acc[n]
                a["busy_s"] += tl.finished - tl.submitted
                a["requests"] += 1
                a["rounds"][-1][0] += tl.last.prompt_tokens
                a["rounds"][-1][1] += tl.last.cached_tokens
    out = {}
    for n, a in acc.items():
        revisit = a["rounds"][1:]
        out[n] = {
            "busy_s": a["busy_s"],
            "requests": a["requests"],
            "hit_rate": sum(c for _, c in revisit) / max(1, sum(p for p, _ in revisit)),
            "hit_rate_all": sum(c for _, c in a["rounds"]) / max(1, sum(p for p, _ in a["rounds"])),
        }
    return out


def _warm_up(engine: Engine, tok) -> None:
    run_timed(engine, [GenerateRequest(chat(tok, [{"role": "user", "content": "Warm-up: say hi."}]), _greedy(2))])


def _eviction_cost(kind: str, leaves: int, calls: int = 500, page: int = 4) -> dict:
    """Fill a tree with `leaves` leaves of one page under a shared stem, then time `calls`
    evictions of one page each (least recently used first)."""
    kv = KVPool(1, (leaves + 2) * page, 1, 8)
    if kind == "radix":
        cache = RadixCache(kv.allocator, page_size=page)
    else:
        cache = HiRadixCache(kv, HostKVPool.like(kv, (leaves + 1) * page), page, write_policy="write_back")
    stem = list(range(-page, 0))
    for i in range(leaves):
        key = stem + [i] * page
        slots = cache.allocator.alloc(len(key))
        cache.allocator.free(slots[: cache.insert(key, slots).cached_len])
    lru = cache.tree.lru if kind == "tiered" else cache.lru
    visited = lru.visited
    t = time.perf_counter()
    for _ in range(calls):
        cache.evict(page)
    us = (time.perf_counter() - t) / calls * 1e6
    return {
        "bench": "hicache_eviction",
        "cache": kind,
        "leaves": leaves,
        "us_per_evict": us,
        "lru_entries_per_evict": (lru.visited - visited) / calls,
    }


def run(quick: bool = False, argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench hicache")
    ap.add_argument("--eviction", action="store_true", help="only the tree's eviction cost (no model)")
    ap.add_argument("--prefixes", type=int, default=None, help="distinct agent prefixes (working set)")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--prefix-tokens", type=int, default=1000)
    ap.add_argument("--disk-dir", default=None, help="disk tier folder (default: a fresh temp folder)")
    args = ap.parse_args(argv or [])
    if args.eviction:
        for kind in ("radix", "tiered"):
            for leaves in (1000, 10_000) if quick else (1000, 10_000, 50_000):
                emit(_eviction_cost(kind, leaves))
        return
    prefixes = args.prefixes or (4 if quick else 8)
    rounds_n = args.rounds or 3

    tok = load_tokenizer(resolve_model_dir(None))
    systems = [agent_system_prompt(tok, args.prefix_tokens, variant=i) for i in range(prefixes + 2)]
    rng = random.Random(0)
    rounds = []
    for r in range(rounds_n):
        order = list(range(prefixes))
        if r:  # revisits come in a shuffled order (fixed seed): some prefixes are recent, most are not
            rng.shuffle(order)
        rounds.append(
            [
                chat(
                    tok,
                    [
                        {"role": "system", "content": systems[i]},
                        {"role": "user", "content": USER_TASKS[(r * prefixes + i) % len(USER_TASKS)]},
                    ],
                )
                for i in order
            ]
        )
    longest = max(len(p) for rnd in rounds for p in rnd) + OUT_TOKENS + 8
    working_set = sum(len(p) for p in rounds[0])
    pool = max(longest, working_set // 4)  # the working set is about 4x the device pool
    common = dict(kv_pool_tokens=pool, chunked_prefill_tokens=512)

    disk_dir = args.disk_dir or tempfile.mkdtemp(prefix="jumpgate-hicache-bench-")
    tiers = dict(
        host_pool_tokens=2 * pool, disk_cache_dir=disk_dir, hicache_page_tokens=64, hicache_write_policy="write_through"
    )
    try:
        l1 = Engine(**common).start()
        hi = Engine(**common, **tiers).start()
        _warm_up(l1, tok)
        _warm_up(hi, tok)
        res = _interleaved({"l1": l1, "tiered": hi}, rounds)
        base, tiered = res["l1"], res["tiered"]
        hi_stats = hi.stats()
        l1.shutdown()
        hi.shutdown()  # persists what is not on disk yet

        restarted = Engine(**common, **tiers).start()
        _warm_up(restarted, tok)
        warm_ttft, cold_ttft, warm_cached = [], [], []
        for k in range(1 if quick else 2):
            user = {"role": "user", "content": f"What is on the schedule today? ({k})"}
            warm_prompt = chat(tok, [{"role": "system", "content": systems[k]}, user])
            cold_prompt = chat(tok, [{"role": "system", "content": systems[prefixes + k]}, user])  # never seen
            warm = run_timed(restarted, [GenerateRequest(warm_prompt, _greedy(2))])[0]
            cold = run_timed(restarted, [GenerateRequest(cold_prompt, _greedy(2))])[0]
            warm_ttft.append(warm.ttft)
            cold_ttft.append(cold.ttft)
            warm_cached.append(warm.last.cached_tokens)
        restart_stats = restarted.stats()
        restarted.shutdown()
    finally:
        if args.disk_dir is None:
            shutil.rmtree(disk_dir, ignore_errors=True)

    emit(
        {
            "bench": "hicache",
            "quick": quick,
            "prefixes": prefixes,
            "rounds": rounds_n,
            "prompt_tokens": longest - OUT_TOKENS - 8,
            "device_pool_tokens": pool,
            "host_pool_tokens": 2 * pool,
            "working_set_tokens": working_set,
            "working_set_vs_device_pool": working_set / pool,
            "l1_only_hit_rate": base["hit_rate"],
            "tiered_hit_rate": tiered["hit_rate"],
            "l1_only_hit_rate_all_rounds": base["hit_rate_all"],
            "tiered_hit_rate_all_rounds": tiered["hit_rate_all"],
            "l1_only_req_s": base["requests"] / base["busy_s"],
            "tiered_req_s": tiered["requests"] / tiered["busy_s"],
            "throughput_vs_l1_only": base["busy_s"] / tiered["busy_s"],
            "restart_warm_ttft_s": sum(warm_ttft) / len(warm_ttft),
            "restart_cold_ttft_s": sum(cold_ttft) / len(cold_ttft),
            "restart_cached_tokens": min(warm_cached),
            "restart_ttft_speedup": sum(cold_ttft) / sum(warm_ttft),
            "loaded_host_tokens": hi_stats.tier_counters.get("hicache_loaded_host_tokens", 0),
            "loaded_disk_tokens": hi_stats.tier_counters.get("hicache_loaded_disk_tokens", 0),
            "restart_loaded_disk_tokens": restart_stats.tier_counters.get("hicache_loaded_disk_tokens", 0),
            "disk_pages_written": hi_stats.tier_counters.get("disk_pages_written", 0),
        }
    )
