"""`python -m bench.probes.corpus_answers NAME[,NAME...] [--sources schemastore] [--max-tokens 384]
[--best-effort]`: named corpus schemas answered one at a time by a fresh server, strict (the fidelity
bench's request: temperature 0, one user line), one JSON line each: status, seconds, finish reason,
the server's validity verdict, tokens, the server's mean decode step, the answer's start (or the error); with `--best-effort`, the
schema errors of the last value. For following single schemas of `python -m bench fidelity`'s
corpus (its packages: `pip install --no-deps kubernetes-validate check-jsonschema bfcl-eval`)."""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import httpx

from bench.fidelity.client import DECODE_HEADER, chat_body
from bench.fidelity.corpus import SOURCES, build_corpus
from bench.harness.common import emit
from bench.harness.server_process import JumpgateServer
from grammar.checks.rollback import schema_validator


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.probes.corpus_answers")
    ap.add_argument("names", help="comma-separated corpus names (e.g. dependabot,taskfile)")
    ap.add_argument("--sources", default="schemastore", help="comma-separated subset of " + ", ".join(SOURCES))
    ap.add_argument("--max-tokens", type=int, default=384)
    ap.add_argument("--best-effort", action="store_true", help="schema_mode best_effort: the last value and its errors")
    args = ap.parse_args(argv)
    wanted = args.names.split(",")
    entries, _ = build_corpus(args.sources.split(","))
    picked = [e for e in entries if e.name in wanted]
    missing = sorted(set(wanted) - {e.name for e in picked})
    if missing:
        raise SystemExit(f"not in the corpus (is its package installed?): {', '.join(missing)}")
    with tempfile.TemporaryDirectory() as work, JumpgateServer(Path(work), kv_pool_tokens=32768) as server:
        with httpx.Client(base_url=server.url, timeout=1800) as client:
            for entry in picked:
                body = chat_body(entry, args.max_tokens)
                if args.best_effort:
                    body["schema_mode"] = "best_effort"
                t0 = time.perf_counter()
                resp = client.post("/v1/chat/completions", json=body)
                out = {
                    "bench": "corpus_answers",
                    "name": entry.name,
                    "status": resp.status_code,
                    "s": round(time.perf_counter() - t0, 1),
                    "best_effort": args.best_effort,
                }
                data = resp.json()
                if resp.status_code != 200:
                    out["error"] = (data.get("error") or {}).get("code")
                else:
                    choice = data["choices"][0]
                    text = choice["message"]["content"] or ""
                    out.update(
                        finish=choice["finish_reason"],
                        valid=(choice.get("jumpgate") or {}).get("schema_valid"),
                        tokens=data["usage"]["completion_tokens"],
                        decode_ms_per_token=float(resp.headers[DECODE_HEADER])
                        if DECODE_HEADER in resp.headers
                        else None,
                        answer=text[:200],
                    )
                    if args.best_effort:
                        try:
                            value = json.loads(text)
                            out["errors"] = [
                                f"{list(e.absolute_path)} {e.validator}"
                                for e in schema_validator(entry.schema).iter_errors(value)
                            ][:20]
                        except ValueError as exc:
                            out["errors"] = [f"not JSON: {exc}"]
                emit(out)


if __name__ == "__main__":
    main()
