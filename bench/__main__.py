"""`python -m bench NAME [...]`: benchmarks, each printing one JSON line per result."""

from __future__ import annotations

import argparse
import importlib
import sys

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
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    ap.add_argument("suite", choices=[*SUITES, "all"])
    ap.add_argument("--quick", action="store_true", help="smaller workloads (smoke runs)")
    args, rest = ap.parse_known_args(argv)
    names = list(SUITES) if args.suite == "all" else [args.suite]
    for name in names:
        try:
            mod = importlib.import_module(SUITES[name])
        except ModuleNotFoundError as e:
            print(f"bench {name}: not available ({e})", file=sys.stderr)
            continue
        mod.run(quick=args.quick, argv=rest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
