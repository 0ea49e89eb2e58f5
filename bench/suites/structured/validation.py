"""Validation after generation, measured on a real `jumpgate serve` (SmolLM2-135M): one JSON line per
result.

- `cost`: for corpus schemas, the request latency (greedy, whole responses) against the time the
  gateway's validation of those very outputs takes (the same `OutputCheck` the server runs, timed
  here in-process: cold = first call, building the validator; warm = the cached validator).
- `duplicates`: open-object schemas sampled at temperature 1: how many outputs repeat a key
  (the grammar cannot prevent it; the gateway detects and counts it).

    python -m bench.suites.structured.validation [--quick] [--what cost|duplicates]
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from bench.harness.common import emit
from bench.harness.server_process import MODEL, JumpgateServer
from gateway.pipeline.constraints import ConstraintPlan
from gateway.pipeline.output_validation import build_output_check

CORPUS = Path(__file__).resolve().parents[3] / "tests" / "data" / "schema_corpus"
COST_SCHEMAS = ("person_basic", "order_with_line_items", "extract_12_fields", "kubernetes_pod_minimal", "recipe")
OPEN_SCHEMAS = (
    "map_additional_properties_integers",
    "feature_flags_map",
    "loop_prone_free_object_map",
    "log_event",
    "kubernetes_pod_minimal",
    "const_object",
)


def _schemas(names: tuple[str, ...]) -> dict[str, dict]:
    found = {n: CORPUS / f"{n}.json" for n in names}
    return {n: json.loads(p.read_text()) for n, p in found.items() if p.exists()}


def _chat(http: httpx.Client, schema: dict, **fields) -> tuple[dict, float]:
    body = {
        "model": MODEL,
        "temperature": 0,
        "max_tokens": 96,
        "messages": [{"role": "user", "content": "Give a realistic example as JSON."}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
        **fields,
    }
    started = time.perf_counter()
    resp = http.post("/v1/chat/completions", json=body)
    elapsed = time.perf_counter() - started
    resp.raise_for_status()
    return resp.json(), elapsed


def _validation_seconds(schema: dict, texts: list[str], repeats: int) -> tuple[float, float]:
    """(cold, warm median) seconds of one choice's validation, as the gateway runs it."""
    check = build_output_check(
        ConstraintPlan(kind="json_schema", payload=schema, strict=True, label="bench"), None, "best_effort"
    )
    assert check is not None
    started = time.perf_counter()
    check.check_text(texts[0] + " ", "stop")  # a new validator only if the schema is new to this process
    cold = time.perf_counter() - started
    warm = []
    for _ in range(repeats):
        for text in texts:
            started = time.perf_counter()
            check.check_text(text, "stop")
            warm.append(time.perf_counter() - started)
    return cold, statistics.median(warm)


def bench_cost(http: httpx.Client, quick: bool) -> None:
    requests = 2 if quick else 8
    for name, schema in _schemas(COST_SCHEMAS[:3] if quick else COST_SCHEMAS).items():
        latencies, texts = [], []
        for i in range(requests):
            body, elapsed = _chat(http, schema, seed=i, schema_mode="best_effort")
            latencies.append(elapsed)
            texts.append(body["choices"][0]["message"]["content"])
        cold, warm = _validation_seconds(schema, texts, repeats=20)
        request = statistics.median(latencies)
        emit(
            {
                "bench": "validation_cost",
                "schema": name,
                "requests": requests,
                "request_ms": request * 1e3,
                "validate_cold_ms": cold * 1e3,
                "validate_warm_ms": warm * 1e3,
                "overhead_pct": 100 * warm / request,
                "output_chars": statistics.median(len(t) for t in texts),
            }
        )


def bench_duplicates(http: httpx.Client, quick: bool) -> None:
    samples = 2 if quick else 8
    for name, schema in _schemas(OPEN_SCHEMAS[:3] if quick else OPEN_SCHEMAS).items():
        body, _ = _chat(http, schema, n=samples, temperature=1.0, seed=11, max_tokens=160, schema_mode="best_effort")
        verdicts = [c.get("jumpgate", {}) for c in body["choices"]]
        messages = [[e["message"] for e in v.get("schema_errors", [])] for v in verdicts]
        emit(
            {
                "bench": "duplicate_keys",
                "schema": name,
                "choices": len(verdicts),
                "with_duplicate_keys": sum(any(m.startswith("duplicate key") for m in ms) for ms in messages),
                "cut_off": sum(c["finish_reason"] == "length" for c in body["choices"]),
                "invalid": sum(not v.get("schema_valid", True) for v in verdicts),
            }
        )


def run(quick: bool = False, argv: list[str] | None = None) -> None:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m bench validation")
    ap.add_argument("--what", choices=["cost", "duplicates"], action="append")
    args = ap.parse_args(argv or [])
    what = args.what or ["cost", "duplicates"]
    with tempfile.TemporaryDirectory(prefix="jumpgate-validation-bench-") as tmp:
        with (
            JumpgateServer(Path(tmp), kv_pool_tokens=8192) as server,
            httpx.Client(base_url=server.url, timeout=600) as http,
        ):
            if "cost" in what:
                bench_cost(http, quick)
            if "duplicates" in what:
                bench_duplicates(http, quick)


if __name__ == "__main__":
    import sys

    args = sys.argv[1:]
    run(quick="--quick" in args, argv=[a for a in args if a != "--quick"])
