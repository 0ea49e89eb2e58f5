"""Totals of `python -m bench fidelity` answer logs: the whole corpus over runs that each did part.

A whole-corpus run takes this 2-core machine longer than a session can spare beside CI, so it is
done in parts: `--log FILE` keeps every answer as it comes, and `--skip-answered FILE` leaves out
the schemas a log already holds (a stopped run resumes; the next part starts where the last ended).

  python -m bench fidelity --tally LOG [LOG ...]

prints one `kind: "tally"` line per source and one for the total: how many of the corpus's schemas
the logs answered (`answered` of `corpus`), and their outcomes. A schema answered in more than one
log counts once, with its last answer (logs are read in the order given).
"""

from __future__ import annotations

import gzip
import json
import statistics
from collections import Counter
from pathlib import Path
from typing import Any, Iterable, Sequence

from bench.fidelity.client import PROMPT_TOO_LONG
from bench.harness.common import emit

OUTCOMES = ("valid", "invalid", "cut_off", "refused", "error")


def answer_lines(paths: Iterable[str | Path]) -> dict[tuple[str, str], dict[str, Any]]:
    """The answer lines of `paths` by (source, name); a later line replaces an earlier one."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for path in paths:
        opener = gzip.open if str(path).endswith(".gz") else open  # logs kept under bench/results are gzipped
        with opener(path, "rt", encoding="utf-8") as f:
            for text in f:
                try:
                    line = json.loads(text)
                except ValueError:
                    continue  # a run killed mid-write leaves half a line
                if isinstance(line, dict) and line.get("kind") == "answer":
                    out[(line["source"], line["name"])] = line
    return out


def answered(paths: Iterable[str | Path]) -> set[tuple[str, str]]:
    return set(answer_lines(paths))


def refused(paths: Iterable[str | Path]) -> set[tuple[str, str]]:
    """The schemas whose last answer in `paths` was a refusal."""
    return {key for key, line in answer_lines(paths).items() if line["outcome"] == "refused"}


def decode_summary(steps: Sequence[tuple[str, float, int]]) -> dict[str, Any]:
    """(name, mean decode step in ms, completion tokens) of each timed answer: the median step,
    the slowest schema and slowest / median (issue #42's target: at most 5)."""
    if not steps:
        return {"decode_ms_per_token_p50": None, "decode_slowest": None, "decode_slowest_over_p50": None}
    median = statistics.median(ms for _, ms, _ in steps)
    name, ms, tokens = max(steps, key=lambda s: s[1])
    return {
        "decode_ms_per_token_p50": round(median, 2),
        "decode_slowest": {"name": name, "ms_per_token": round(ms, 2), "completion_tokens": tokens},
        "decode_slowest_over_p50": round(ms / median, 2) if median else None,
    }


def tally(lines: Sequence[dict[str, Any]], corpus: int | None = None) -> dict[str, Any]:
    outcomes = Counter(line["outcome"] for line in lines)
    out: dict[str, Any] = {"answered": len(lines)}
    if corpus is not None:
        out["corpus"] = corpus
    out.update({name: outcomes.get(name, 0) for name in OUTCOMES})
    out.update(
        engines=dict(sorted(Counter(str(line.get("engine")) for line in lines).items())),
        commits=dict(sorted(Counter(str(line.get("commit", "?")) for line in lines).items())),
        duplicate_keys=sum(bool(line.get("duplicate_keys")) for line in lines),
        closed_at_budget=sum(bool(line.get("closed_at_budget")) for line in lines),
        valid_at_length=sum(line["outcome"] == "valid" and line.get("finish_reason") == "length" for line in lines),
        prompt_length_refusals=sum(
            line["outcome"] == "refused" and str(line.get("message", "")).startswith(PROMPT_TOO_LONG) for line in lines
        ),
        value_retries_exhausted=sum(
            str(line.get("message", "")).startswith("value_retries_exhausted") for line in lines
        ),
        answered_validly_frac=outcomes.get("valid", 0) / len(lines) if lines else None,
        **decode_summary(
            [
                (line["name"], line["decode_ms_per_token"], line.get("completion_tokens", 0))
                for line in lines
                if line.get("decode_ms_per_token") is not None
            ]
        ),
    )
    return out


def run(paths: Sequence[str]) -> None:
    from bench.fidelity.corpus import SOURCES, build_corpus

    by_schema = answer_lines(paths)
    _, stats = build_corpus(list(SOURCES))
    sources = [s for s in stats if stats[s].available]
    for source in sources:
        mine = [line for (s, _), line in by_schema.items() if s == source]
        emit({"bench": "fidelity", "kind": "tally", "source": source, **tally(mine, stats[source].kept)})
    emit(
        {
            "bench": "fidelity",
            "kind": "tally",
            "source": "total",
            "logs": list(paths),
            **tally([line for (s, _), line in by_schema.items() if s in sources], sum(stats[s].kept for s in sources)),
        }
    )
