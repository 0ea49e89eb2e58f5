"""`python -m bench batch`: the Batch API against the same requests sent online, on one server.

N extraction requests over 4 shared prefixes (4 staff directories, each a ~700-token system
prompt; the user asks for one person's record under a strict json_schema), in file order the
prefixes interleaved. One server (`--batch-concurrency` lines in flight) runs them once as a batch
(upload, create, poll until completed, read the output file) and once online at `--concurrency`
4 (non-streamed chat completions over HTTP). One warm-up request per prefix first, so both runs
start with the same cache. One JSON line per mode with req_s and cached_frac (cached / prompt
tokens from the answers' usage), then a summary line with batch_vs_online = batch req_s / online
req_s (issue #46 item 2's targets: cached_frac >= 0.95 and >= 1.5x).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Sequence

import httpx

from bench.harness.chat_workloads import DOCUMENT_PEOPLE, extract_document
from bench.harness.common import emit, git_commit
from bench.harness.server_process import MODEL, JumpgateServer

PREFIXES = 4
SCHEMA = {
    "type": "object",
    "properties": {
        "full_name": {"type": "string", "maxLength": 40},
        "job_title": {"type": "string", "maxLength": 40},
        "headquarters_city": {"type": "string", "maxLength": 30},
    },
    "required": ["full_name", "job_title", "headquarters_city"],
    "additionalProperties": False,
}


def directory(k: int) -> str:
    """The k-th shared prefix: the staff directory under another consortium's name."""
    return f"Directory {k} of partner group {chr(65 + k)}.\n" + extract_document()


def request_body(i: int, max_tokens: int) -> dict:
    k = i % PREFIXES
    name = DOCUMENT_PEOPLE[(i // PREFIXES) % len(DOCUMENT_PEOPLE)][0]
    return {
        "model": MODEL,
        "temperature": 0,
        "max_tokens": max_tokens,
        "response_format": {"type": "json_schema", "json_schema": {"name": "person", "strict": True, "schema": SCHEMA}},
        "messages": [
            {"role": "system", "content": directory(k)},
            {"role": "user", "content": f"Extract the record of {name} (request {i})."},
        ],
    }


def usage_totals(bodies: list[dict]) -> tuple[int, int, int]:
    prompt = sum(b["usage"]["prompt_tokens"] for b in bodies)
    cached = sum((b["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0) for b in bodies)
    completion = sum(b["usage"]["completion_tokens"] for b in bodies)
    return prompt, cached, completion


async def run_online(url: str, bodies: list[dict], concurrency: int) -> tuple[float, list[dict], int]:
    gate = asyncio.Semaphore(concurrency)
    answers: list[dict] = []
    errors = 0

    async def one(client: httpx.AsyncClient, body: dict) -> None:
        nonlocal errors
        async with gate:
            r = await client.post(url + "/chat/completions", json=body)
        if r.status_code == 200:
            answers.append(r.json())
        else:
            errors += 1

    async with httpx.AsyncClient(timeout=600) as client:
        t0 = time.perf_counter()
        await asyncio.gather(*(one(client, b) for b in bodies))
        return time.perf_counter() - t0, answers, errors


def run_batch(url: str, bodies: list[dict], timeout_s: float) -> tuple[float, list[dict], int, dict]:
    lines = b"".join(
        json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions", "body": b}).encode() + b"\n"
        for i, b in enumerate(bodies)
    )
    with httpx.Client(base_url=url, timeout=120) as client:
        f = client.post(
            "/files", files={"file": ("bench.jsonl", lines, "application/jsonl")}, data={"purpose": "batch"}
        )
        f.raise_for_status()
        t0 = time.perf_counter()
        batch = client.post(
            "/batches",
            json={"input_file_id": f.json()["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"},
        ).json()
        deadline = time.monotonic() + timeout_s
        while batch["status"] not in ("completed", "failed", "cancelled", "expired"):
            if time.monotonic() > deadline:
                raise RuntimeError(f"batch not done in {timeout_s:.0f} s: {batch}")
            time.sleep(0.2)
            batch = client.get(f"/batches/{batch['id']}").json()
        elapsed = time.perf_counter() - t0
        if batch["status"] != "completed":
            raise RuntimeError(f"batch ended {batch['status']}: {batch}")
        out = client.get(f"/files/{batch['output_file_id']}/content").text.splitlines()
        answers = [json.loads(x)["response"]["body"] for x in out]
        return elapsed, answers, batch["request_counts"]["failed"], batch


def record(mode: str, n: int, elapsed: float, answers: list[dict], errors: int, **extra) -> dict:
    prompt, cached, completion = usage_totals(answers)
    valid = sum(1 for a in answers if a["choices"][0].get("jumpgate", {}).get("schema_valid", True))
    return {
        "suite": "batch",
        "mode": mode,
        "requests": n,
        "answered": len(answers),
        "errors": errors,
        "elapsed_s": elapsed,
        "req_s": len(answers) / elapsed if elapsed else 0.0,
        "output_tok_s": completion / elapsed if elapsed else 0.0,
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "cached_frac": cached / prompt if prompt else 0.0,
        "valid_frac": valid / len(answers) if answers else 0.0,
        **extra,
    }


def run(quick: bool = False, argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench batch", description=__doc__)
    ap.add_argument("--requests", type=int, default=None, help="requests per mode (default 1000; --quick 16)")
    ap.add_argument("--max-tokens", type=int, default=None, help="max_tokens of each request (default 48; --quick 24)")
    ap.add_argument("--concurrency", type=int, default=4, help="online clients")
    ap.add_argument("--batch-concurrency", type=int, default=16, help="the server's --batch-concurrency")
    ap.add_argument("--kv-pool-tokens", type=int, default=16384)
    ap.add_argument("--timeout", type=float, default=7200.0, help="seconds the batch may take")
    args = ap.parse_args(list(argv or []))
    n = args.requests or (16 if quick else 1000)
    max_tokens = args.max_tokens or (24 if quick else 48)
    bodies = [request_body(i, max_tokens) for i in range(n)]
    with tempfile.TemporaryDirectory(prefix="bench-batch-") as work:
        with JumpgateServer(
            Path(work),
            kv_pool_tokens=args.kv_pool_tokens,
            extra_args=["--batch-concurrency", str(args.batch_concurrency)],
        ) as server:
            asyncio.run(run_online(server.base_url, [request_body(k, max_tokens) for k in range(PREFIXES)], 1))
            common = {"commit": git_commit(), "max_tokens": max_tokens, "prefixes": PREFIXES}
            elapsed, answers, failed, _ = run_batch(server.base_url, bodies, args.timeout)
            batch = record("batch", n, elapsed, answers, failed, concurrency=args.batch_concurrency, **common)
            emit(batch)
            elapsed, answers, errors = asyncio.run(run_online(server.base_url, bodies, args.concurrency))
            online = record("online", n, elapsed, answers, errors, concurrency=args.concurrency, **common)
            emit(online)
    emit(
        {
            "suite": "batch",
            "mode": "summary",
            "requests": n,
            **common,
            "batch_req_s": batch["req_s"],
            "online_req_s": online["req_s"],
            "batch_vs_online": batch["req_s"] / online["req_s"] if online["req_s"] else 0.0,
            "batch_cached_frac": batch["cached_frac"],
            "online_cached_frac": online["cached_frac"],
        }
    )


if __name__ == "__main__":
    run()
