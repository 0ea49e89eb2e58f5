"""`python -m bench NAME [...]`: benchmarks, each printing one JSON line per result.

`python -m bench --help` lists every suite and every probe (bench/probes/) with one line each."""

from __future__ import annotations

import argparse
import importlib
import sys
import traceback

SUITES = {
    "engine": "bench.suites.engine",
    "cache": "bench.suites.kvcache.cache",
    "cascade": "bench.suites.kvcache.cascade",
    "hicache": "bench.suites.kvcache.hicache",
    "grammar": "bench.suites.structured.grammar",
    "grammar_engines": "bench.suites.structured.grammar_engines",
    "value_check": "bench.suites.structured.value_check",
    "serve": "bench.suites.serve",
    "soak": "bench.suites.soak",
    "validation": "bench.suites.structured.validation",
    "fidelity": "bench.suites.structured.fidelity",
    "cluster": "bench.suites.cluster",
    "batch": "bench.suites.batch",
    "ttft": "bench.suites.ttft",
}


# One line each for `--help` (tests/bench/test_bench_listing.py checks every suite has one).
SUITE_HELP = {
    "engine": "prefill and decode tokens/s per weight format, side by side with fp32 (in-process)",
    "cache": "the prefix cache on agent-like workloads: hit rate, cold vs warm TTFT, LPM vs FCFS",
    "cascade": "one batched decode step over a long shared prefix, cascade attention on and off",
    "hicache": "the host/disk KV tiers on a working set about 4x the device pool, and a warm restart",
    "grammar": "what grammars cost and buy: mask overhead, jump-forward, compile cache, completeness",
    "grammar_engines": "token-mask time per constrained token, xgrammar vs llguidance, on corpus schemas",
    "value_check": "what the value check (no repeated names or items) adds to the mask time",
    "serve": "the whole server over HTTP on agent workloads (--baseline DIR, --vllm PYTHON to compare)",
    "soak": "many clients, disconnects, bad input, uploads, stored responses on a small pool (--cluster)",
    "validation": "what validation after generation costs a real server, per corpus schema",
    "fidelity": "strict answers to real-world schemas (Kubernetes, SchemaStore, BFCL) through a server",
    "cluster": "prefix-aware vs round-robin vs power-of-two routing over 2 replicas on Ray Serve",
    "batch": "the Batch API vs the same extraction requests online at concurrency 4: req/s ratio, cached fraction",
    "ttft": "cold time to first token at ~1k/3k/8k unique prompt tokens, streamed, one at a time (--vllm PYTHON)",
}
# Probes: `python -m bench.probes.NAME [...]`, no --quick, not run by CI (bench/probes/__init__.py).
PROBES = {
    "attention_precision": "the cpu attention kernel alone: prefill and decode per --attention-precision, and vector",
    "closing_plan_cost": "one completion plan and one budget check on a 48-property schema, per engine",
    "corpus_answers": "named corpus schemas answered strict by a fresh server, one line each (fidelity, by name)",
    "guard_cost": "the real engine on that schema under the strict guard's budget rule and the one before",
    "layer_loop_bench": "a decode pass with the decoder layers in one C++ call vs the Python layer loop",
    "logprobs_overhead": "a greedy decode batch without logprobs, with them, and with 20 alternatives",
    "moe_bench": "one MoE layer with a pass's experts grouped (one matmul per active expert) vs per token",
    "quant_linear_bench": "the q4 linear kernels vs what they replaced; --stream: GB/s read a second; "
    "--tile-ceiling: the bf16 tile and an int8-activation tile vs the dot-product peaks",
    "think_block_cost": "a think block before a JSON answer: mask + accept per token, the strict guard's calls inside the block",
    "window_kv_bytes": "KV bytes per token of context for a tiny Gemma 3 at 4k, window layers' own pool vs every position kept",
    "device_check": "the CUDA path: Triton kernels vs torch, CUDA graphs (bash bench/device_check.sh)",
    "device_engine": "the whole engine on a GPU, Triton + CUDA graphs vs the torch backend",
}


def _listing() -> str:
    width = max(map(len, [*SUITES, *PROBES]))
    suites = "\n".join(f"  {name:<{width}}  {SUITE_HELP.get(name, '')}" for name in SUITES)
    probes = "\n".join(f"  {name:<{width}}  {line}" for name, line in PROBES.items())
    return (
        f"suites (python -m bench NAME [--quick] [its flags]; `all` runs every one):\n{suites}\n\n"
        f"probes (python -m bench.probes.NAME [its flags]):\n{probes}"
    )


def main(argv: list[str] | None = None) -> int:
    """0 when every suite asked for ran to its end; 1 when any raised (after running the others,
    for `all`), so a broken bench fails CI instead of printing a traceback nobody reads."""
    ap = argparse.ArgumentParser(
        prog="python -m bench",
        description=__doc__.split("\n")[0],
        epilog=_listing(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("suite", choices=[*SUITES, "all"], metavar="SUITE", help="a suite below, or all")
    ap.add_argument("--quick", action="store_true", help="smaller workloads (smoke runs)")
    args, rest = ap.parse_known_args(argv)
    names = list(SUITES) if args.suite == "all" else [args.suite]
    failed = []
    for name in names:
        try:
            importlib.import_module(SUITES[name]).run(quick=args.quick, argv=rest)
        except Exception:
            traceback.print_exc()
            print(f"bench {name}: FAILED", file=sys.stderr)
            failed.append(name)
    if failed:
        print(f"bench: {len(failed)} of {len(names)} suites failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
