"""`python -m bench soak`: many concurrent clients against a server with a small KV pool.

Starts `jumpgate serve --kv-pool-tokens 4096` and, for a bounded time (default 120 s, --quick
40 s), runs 64 concurrent streaming clients. Each client repeatedly picks: 20% a valid request it
hangs up on part-way (after a few SSE events, or while still queued), 10% a bad request (malformed
JSON, wrong types, unknown model or schema id, invalid schema or regex, missing tool, oversized
body, ...), and otherwise a valid request whose output is checked against its schema: agent-tools
(short system prompt + the 8 tools of schemas/agent_tools.json, tool_choice "required", one call)
or json-extract (a shared document, a 5-field strict schema). A background thread hits /health every 100 ms and samples the server's RSS.
At the deadline the requests still in flight are cancelled (one more wave of disconnects), the
server is given time to go idle, and /metrics is read for slots left behind.

One JSON line: requests, completed_ok, server_errors (5xx or an error event in a stream),
invalid_outputs, leaked_slots (KV slots held only by requests once idle), running_after_idle,
rss_growth_mb (mean RSS over the last third of the run minus the mean over the second third),
p99_health_ms, and the counts behind them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import httpx

from bench.common import emit
from bench.server_process import JumpgateServer
from bench.serve_bench import (
    EXTRACT_SCHEMA_PATH,
    MODEL,
    DOCUMENT_PEOPLE,
    Result,
    exit_on_sigterm,
    json_valid,
    percentile,
    stream_chat,
    tool_calls_valid,
)
from bench.workloads import USER_TASKS, agent_tools

# json-extract in the soak: the first five fields of tests/data/schema_corpus/extract_12_fields.json,
# with bounded strings, so that a request can finish while 63 others share the CPU.
CONTACT_SCHEMA = {
    "type": "object",
    "properties": {k: {"type": "string", "maxLength": 60} for k in (
        "full_name", "job_title", "company_name", "headquarters_city", "email")},
    "required": ["full_name", "job_title", "company_name", "headquarters_city", "email"],
    "additionalProperties": False,
}
AGENT_SYSTEM = ("You are Atlas, an operations agent for a logistics company. Call exactly the tool that the "
                "user's request needs, with precise arguments.")


def short_document() -> str:
    lines = ["Staff directory (excerpt).\n"]
    for name, title, company, industry, site, city, skills, langs, prev in DOCUMENT_PEOPLE[:4]:
        first = name.split()[0].lower()
        lines.append(f"{name}, {title} at {company} ({industry}, {city}, https://www.{site}), {first}@{site}. "
                     f"Skills: {', '.join(skills)}. Languages: {', '.join(langs)}. Before: {', '.join(prev)}.\n")
    return "".join(lines)


@dataclass
class Counters:
    requests: int = 0
    valid_requests: int = 0
    completed_ok: int = 0
    incomplete: int = 0  # valid requests that ended with finish_reason "length"
    invalid_outputs: int = 0
    disconnects: int = 0
    bad_requests: int = 0
    bad_rejected_ok: int = 0  # bad requests answered with the expected 4xx and an OpenAI error body
    bad_accepted: int = 0  # bad requests that were not refused (should be 0)
    server_errors: int = 0
    client_errors: int = 0  # unexpected 4xx on valid requests
    transport_errors: int = 0
    cancelled_at_end: int = 0
    by_status: dict[str, int] = field(default_factory=dict)
    error_samples: list[str] = field(default_factory=list)

    def status(self, code: int) -> None:
        self.by_status[str(code)] = self.by_status.get(str(code), 0) + 1

    def sample(self, text: str) -> None:
        if len(self.error_samples) < 5:
            self.error_samples.append(text[:300])


class Soak:
    def __init__(self, url: str, args: argparse.Namespace):
        self.url = url
        self.args = args
        self.c = Counters()
        tools = agent_tools()
        self.tools = tools
        self.tool_params = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
        self.extract_schema = CONTACT_SCHEMA
        self.document = short_document()
        self.bad = self._bad_requests()

    # ------------------------------------------------------------------ request bodies

    def valid_body(self, rng: random.Random) -> tuple[str, dict[str, Any]]:
        common = {"model": MODEL, "temperature": 0, "max_tokens": self.args.max_tokens}
        if rng.random() < 0.5:
            task = USER_TASKS[rng.randrange(len(USER_TASKS))]
            return "agent", {**common, "tools": self.tools, "tool_choice": "required", "parallel_tool_calls": False,
                             "messages": [{"role": "system", "content": AGENT_SYSTEM}, {"role": "user", "content": task}]}
        name = DOCUMENT_PEOPLE[rng.randrange(4)][0]
        return "extract", {**common, "messages": [
            {"role": "system", "content": self.document},
            {"role": "user", "content": f"Extract the record of {name}."}],
            "response_format": {"type": "json_schema", "json_schema": {
                "name": "record", "strict": True, "schema": self.extract_schema}}}

    def _bad_requests(self) -> list[tuple[str, dict[str, Any]]]:
        """(name, httpx request kwargs); every one must come back 4xx with an OpenAI error body."""
        user = [{"role": "user", "content": "hi"}]
        base = {"model": MODEL, "messages": user, "max_tokens": 8}
        js = lambda **kw: {"json": {**base, **kw}}  # noqa: E731
        return [
            ("malformed_json", {"content": b'{"model": "x", "messages": [', "headers": {"content-type": "application/json"}}),
            ("wrong_type", js(max_tokens="ten")),
            ("unknown_model", js(model="gpt-imaginary")),
            ("empty_messages", js(messages=[])),
            ("invalid_schema", js(response_format={"type": "json_schema", "json_schema": {
                "name": "x", "schema": {"type": "object", "properties": {"a": {"type": "integr"}}}}})),
            ("bad_regex", js(regex="(ab")),
            ("unknown_schema_id", js(schema_id="sch_" + "0" * 24)),
            ("missing_tool", js(tools=self.tools[:2], tool_choice={"type": "function", "function": {"name": "nope"}})),
            ("prompt_too_long", js(messages=[{"role": "user", "content": "hello " * 5000}])),
            ("max_tokens_below_schema", js(max_tokens=3, response_format={"type": "json_schema", "json_schema": {
                "name": "x", "strict": True, "schema": json.loads(EXTRACT_SCHEMA_PATH.read_text())}})),
            ("body_too_large", js(messages=[{"role": "user", "content": "x" * (5 * 1024 * 1024)}])),
        ]

    # ------------------------------------------------------------------ one action of a client

    def _record_stream(self, kind: str, r: Result) -> None:
        c = self.c
        c.status(r.status)
        if r.status >= 500:
            c.server_errors += 1
            c.sample(f"{kind}: HTTP {r.status}: {r.error}")
            return
        if r.status != 200:
            c.client_errors += 1
            c.sample(f"{kind}: HTTP {r.status}: {r.error}")
            return
        if r.error is not None or not r.saw_done:
            c.server_errors += 1  # an error event inside the stream, or a stream cut by the server
            c.sample(f"{kind}: stream error: {r.error} (done={r.saw_done})")
            return
        if kind == "agent":
            calls = [(x["name"], x["arguments"]) for _, x in sorted(r.tool_calls.items())]
            valid = tool_calls_valid(calls, self.tool_params)
        else:
            valid = json_valid(r.content, self.extract_schema)
        if r.finish_reason == "length":
            c.incomplete += 1
        if valid:
            c.completed_ok += 1
        else:
            c.invalid_outputs += 1
            c.sample(f"{kind}: invalid output (finish={r.finish_reason}): {r.content[:120]} {r.tool_calls}")

    async def valid(self, client: httpx.AsyncClient, rng: random.Random) -> None:
        kind, body = self.valid_body(rng)
        self.c.valid_requests += 1
        r = await asyncio.wait_for(stream_chat(client, body), timeout=self.args.request_timeout)
        self._record_stream(kind, r)

    async def disconnect(self, client: httpx.AsyncClient, rng: random.Random) -> None:
        kind, body = self.valid_body(rng)
        self.c.disconnects += 1
        after_events = rng.randint(1, 8)
        after_s = rng.uniform(0.2, 6.0)  # may hang up while still queued, before any event

        async def hang_up(n: int) -> bool:
            return n >= after_events

        try:
            r = await asyncio.wait_for(stream_chat(client, body, on_event=hang_up), timeout=after_s)
        except asyncio.TimeoutError:
            return
        if r.status >= 500:
            self.c.status(r.status)
            self.c.server_errors += 1
            self.c.sample(f"disconnect/{kind}: HTTP {r.status}: {r.error}")

    async def bad_request(self, client: httpx.AsyncClient, rng: random.Random) -> None:
        name, kwargs = self.bad[rng.randrange(len(self.bad))]
        self.c.bad_requests += 1
        resp = await client.post("/v1/chat/completions", **kwargs)
        self.c.status(resp.status_code)
        if resp.status_code >= 500:
            self.c.server_errors += 1
            self.c.sample(f"bad/{name}: HTTP {resp.status_code}: {resp.text[:200]}")
            return
        if resp.status_code < 400:
            self.c.bad_accepted += 1
            self.c.sample(f"bad/{name}: accepted with {resp.status_code}")
            return
        try:
            err = resp.json()["error"]
            shaped = set(err) == {"message", "type", "param", "code"}
        except (ValueError, KeyError, TypeError):
            shaped = False
        if shaped:
            self.c.bad_rejected_ok += 1
        else:
            self.c.sample(f"bad/{name}: {resp.status_code} without an OpenAI error body: {resp.text[:200]}")

    # ------------------------------------------------------------------ the clients

    async def client_loop(self, client: httpx.AsyncClient, index: int, deadline: float) -> None:
        rng = random.Random(self.args.seed * 1000 + index)
        await asyncio.sleep(rng.uniform(0, 1.0))  # do not start all 64 in the same millisecond
        while time.monotonic() < deadline:
            roll = rng.random()
            action = (self.disconnect if roll < self.args.disconnect_frac else
                      self.bad_request if roll < self.args.disconnect_frac + self.args.bad_frac else self.valid)
            self.c.requests += 1
            try:
                await action(client, rng)
            except asyncio.CancelledError:
                self.c.cancelled_at_end += 1
                raise
            except (httpx.HTTPError, asyncio.TimeoutError) as exc:
                self.c.transport_errors += 1
                self.c.sample(f"{action.__name__}: {type(exc).__name__}: {exc}")

    async def run(self, deadline: float) -> None:
        limits = httpx.Limits(max_connections=self.args.clients + 8, max_keepalive_connections=self.args.clients + 8)
        async with httpx.AsyncClient(base_url=self.url, timeout=httpx.Timeout(self.args.request_timeout, connect=30),
                                     limits=limits) as client:
            tasks = [asyncio.create_task(self.client_loop(client, i, deadline)) for i in range(self.args.clients)]
            await asyncio.sleep(max(0.0, deadline - time.monotonic()))
            # the deadline: requests still in flight are cancelled (their connections close)
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


class Poller(threading.Thread):
    """/health every `interval` s (latency in ms) and the server's RSS once a second."""

    def __init__(self, server: JumpgateServer, interval: float = 0.1):
        super().__init__(name="soak-poller", daemon=True)
        self.server = server
        self.interval = interval
        self.health_ms: list[float] = []
        self.health_failures = 0
        self.rss: list[tuple[float, float]] = []  # (monotonic time, MB)
        self._halt = threading.Event()

    def run(self) -> None:
        last_rss = 0.0
        with httpx.Client(base_url=self.server.url, timeout=5.0) as client:
            while not self._halt.is_set():
                t0 = time.perf_counter()
                try:
                    ok = client.get("/health").status_code == 200
                except httpx.HTTPError:
                    ok = False
                elapsed = time.perf_counter() - t0
                if ok:
                    self.health_ms.append(elapsed * 1000.0)
                else:
                    self.health_failures += 1
                now = time.monotonic()
                if now - last_rss >= 1.0:
                    self.rss.append((now, self.server.rss_mb()))
                    last_rss = now
                self._halt.wait(max(0.0, self.interval - elapsed))

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=10)


def mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def parse_args(quick: bool, argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench soak", description="soak test of the HTTP server")
    ap.add_argument("--duration", type=float, default=40.0 if quick else 120.0, help="seconds of load")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--kv-pool-tokens", type=int, default=4096)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--max-running-requests", type=int, default=16,
                    help="the server's batch limit; the other clients wait in its queue (a 2-core CPU cannot "
                         "finish anything with 64 long-context requests decoding side by side in 40 s)")
    ap.add_argument("--disconnect-frac", type=float, default=0.2)
    ap.add_argument("--bad-frac", type=float, default=0.1)
    ap.add_argument("--request-timeout", type=float, default=600.0)
    ap.add_argument("--idle-timeout", type=float, default=60.0, help="seconds to wait for the server to go idle")
    ap.add_argument("--seed", type=int, default=0)
    return ap.parse_args(list(argv or []))


def run(quick: bool = False, argv: Sequence[str] | None = None) -> None:
    args = parse_args(quick, argv)
    exit_on_sigterm()
    with tempfile.TemporaryDirectory(prefix="jumpgate-soak-") as tmp:
        server = JumpgateServer(Path(tmp), kv_pool_tokens=args.kv_pool_tokens, startup_timeout_s=300,
                                extra_args=["--max-running-requests", str(args.max_running_requests)])
        with server:
            soak = Soak(server.url, args)
            # warm-up outside the measured window: compile both grammars once
            async def warm() -> None:
                async with httpx.AsyncClient(base_url=server.url, timeout=600) as client:
                    rng = random.Random(1)
                    kinds = set()
                    while len(kinds) < 2:
                        kind, body = soak.valid_body(rng)
                        if kind not in kinds:
                            kinds.add(kind)
                            await stream_chat(client, {**body, "max_tokens": args.max_tokens})
            asyncio.run(warm())

            poller = Poller(server)
            t_start = time.monotonic()
            poller.start()
            asyncio.run(soak.run(t_start + args.duration))
            t_end = time.monotonic()
            after = server.wait_metrics(timeout_s=args.idle_timeout, interval_s=0.25)
            idle_wait = time.monotonic() - t_end
            poller.stop()
            rss_final = server.rss_mb()

    third = (t_end - t_start) / 3.0
    second = [mb for t, mb in poller.rss if t_start + third <= t < t_start + 2 * third]
    last = [mb for t, mb in poller.rss if t_start + 2 * third <= t <= t_end]
    m2, m3 = mean(second), mean(last)
    c = soak.c
    emit({
        "bench": "soak", "duration_s": t_end - t_start, "clients": args.clients, "kv_pool_tokens": args.kv_pool_tokens,
        "max_running_requests": args.max_running_requests,
        "requests": c.requests, "completed_ok": c.completed_ok, "server_errors": c.server_errors,
        "invalid_outputs": c.invalid_outputs,
        "leaked_slots": int(after.get("jumpgate_kv_slots_request_only", -1)),
        "running_after_idle": int(after.get("jumpgate_running_requests", -1)),
        "waiting_after_idle": int(after.get("jumpgate_waiting_requests", -1)),
        "in_flight_after_idle": int(after.get("jumpgate_gateway_in_flight_requests", -1)),
        "idle_wait_s": idle_wait,
        "rss_growth_mb": (m3 - m2) if m2 is not None and m3 is not None else None,
        "rss_mb_end": rss_final,
        "p99_health_ms": percentile(poller.health_ms, 0.99),
        "p50_health_ms": percentile(poller.health_ms, 0.5),
        "max_health_ms": max(poller.health_ms) if poller.health_ms else None,
        "health_checks": len(poller.health_ms), "health_failures": poller.health_failures,
        "valid_requests": c.valid_requests, "incomplete_length": c.incomplete, "disconnects": c.disconnects,
        "bad_requests": c.bad_requests, "bad_rejected_ok": c.bad_rejected_ok, "bad_accepted": c.bad_accepted,
        "client_errors": c.client_errors, "transport_errors": c.transport_errors,
        "cancelled_at_end": c.cancelled_at_end,
        "tokens_generated": int(after.get("jumpgate_generation_tokens_total", 0)),
        "retractions": int(after.get("jumpgate_engine_retractions", 0)),
        "by_status": c.by_status, "error_samples": c.error_samples,
    })
