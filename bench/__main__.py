"""`python -m bench NAME [...]`: benchmarks, each printing one JSON line per result."""

from __future__ import annotations

import argparse
import importlib
import sys
import traceback

SUITES = {
    "engine": "bench.engine_bench",
    "cache": "bench.cache_bench",
    "cascade": "bench.cascade_bench",
    "hicache": "bench.hicache_bench",
    "grammar": "bench.grammar_bench",
    "grammar_engines": "bench.grammar_engines_bench",
    "value_check": "bench.value_check_bench",
    "serve": "bench.serve_bench",
    "soak": "bench.soak_bench",
    "validation": "bench.validation_bench",
    "fidelity": "bench.fidelity_bench",
    "cluster": "bench.cluster_bench",
}


def main(argv: list[str] | None = None) -> int:
    """0 when every suite asked for ran to its end; 1 when any raised (after running the others,
    for `all`), so a broken bench fails CI instead of printing a traceback nobody reads."""
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    ap.add_argument("suite", choices=[*SUITES, "all"])
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
