"""The soak bench's clients: `Soak` runs many concurrent sessions against one server (chat, strict and
streamed requests, disconnects, bad input, schema uploads, stored responses) and counts what each
outcome was (`Counters`); suites/soak.py starts the server, the pollers and the report."""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from bench.harness.chat_workloads import (
    DOCUMENT_PEOPLE,
    EXTRACT_SCHEMA_PATH,
    MODEL,
    Result,
    json_valid,
    post_chat,
    stream_chat,
    tool_calls_valid,
)
from bench.harness.replica_killer import ReplicaKiller
from bench.harness.workloads import USER_TASKS, agent_tools

# json-extract in the soak: the first five fields of tests/data/schema_corpus/extract_12_fields.json,
# with bounded strings, so that a request can finish while 63 others share the CPU.


CONTACT_SCHEMA = {
    "type": "object",
    "properties": {
        k: {"type": "string", "maxLength": 60}
        for k in ("full_name", "job_title", "company_name", "headquarters_city", "email")
    },
    "required": ["full_name", "job_title", "company_name", "headquarters_city", "email"],
    "additionalProperties": False,
}
AGENT_SYSTEM = (
    "You are Atlas, an operations agent for a logistics company. Call exactly the tool that the "
    "user's request needs, with precise arguments."
)


def upload_schema(tag: str, n: int) -> dict[str, Any]:
    """The n-th upload's schema: each one its own registry id and grammar (bounds and description differ)."""
    return {
        "type": "object",
        "description": f"soak upload {tag}-{n}",
        "properties": {
            "full_name": {"type": "string", "maxLength": 24 + n % 32},
            "city": {"type": "string", "maxLength": 40},
            "years_in_role": {"type": "integer", "minimum": 0, "maximum": 40 + n % 60},
        },
        "required": ["full_name", "city", "years_in_role"],
        "additionalProperties": False,
    }


def short_document() -> str:
    lines = ["Staff directory (excerpt).\n"]
    for name, title, company, industry, site, city, skills, langs, prev in DOCUMENT_PEOPLE[:4]:
        first = name.split()[0].lower()
        lines.append(
            f"{name}, {title} at {company} ({industry}, {city}, https://www.{site}), {first}@{site}. "
            f"Skills: {', '.join(skills)}. Languages: {', '.join(langs)}. Before: {', '.join(prev)}.\n"
        )
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
    non_streamed: int = 0
    uploads: int = 0
    uploads_acknowledged: int = 0
    uploads_lost: int = 0  # acknowledged, then not readable at the end
    responses_stored: int = 0
    responses_lost: int = 0
    killed_in_flight: int = 0  # --cluster: the clear 503 engine_stopped of a request a killed replica held
    killed_by_status: dict[str, int] = field(default_factory=dict)
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
        self.killer: ReplicaKiller | None = None
        self.uploaded: dict[str, dict[str, Any]] = {}  # acknowledged schema id -> schema
        self.stored: list[str] = []  # acknowledged stored response ids
        self.upload_seq = 0

    # ------------------------------------------------------------------ request bodies

    def valid_body(self, rng: random.Random) -> tuple[str, dict[str, Any]]:
        common = {"model": MODEL, "temperature": 0, "max_tokens": self.args.max_tokens}
        if rng.random() < 0.5:
            task = USER_TASKS[rng.randrange(len(USER_TASKS))]
            return "agent", {
                **common,
                "tools": self.tools,
                "tool_choice": "required",
                "parallel_tool_calls": False,
                "messages": [{"role": "system", "content": AGENT_SYSTEM}, {"role": "user", "content": task}],
            }
        name = DOCUMENT_PEOPLE[rng.randrange(4)][0]
        return "extract", {
            **common,
            "messages": [
                {"role": "system", "content": self.document},
                {"role": "user", "content": f"Extract the record of {name}."},
            ],
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "record", "strict": True, "schema": self.extract_schema},
            },
        }

    def _bad_requests(self) -> list[tuple[str, dict[str, Any]]]:
        """(name, httpx request kwargs); every one must come back 4xx with an OpenAI error body."""
        user = [{"role": "user", "content": "hi"}]
        base = {"model": MODEL, "messages": user, "max_tokens": 8}
        js = lambda **kw: {"json": {**base, **kw}}  # noqa: E731
        return [
            (
                "malformed_json",
                {"content": b'{"model": "x", "messages": [', "headers": {"content-type": "application/json"}},
            ),
            ("wrong_type", js(max_tokens="ten")),
            ("unknown_model", js(model="gpt-imaginary")),
            ("empty_messages", js(messages=[])),
            (
                "invalid_schema",
                js(
                    response_format={
                        "type": "json_schema",
                        "json_schema": {
                            "name": "x",
                            "schema": {"type": "object", "properties": {"a": {"type": "integr"}}},
                        },
                    }
                ),
            ),
            ("bad_regex", js(regex="(ab")),
            ("unknown_schema_id", js(schema_id="sch_" + "0" * 24)),
            ("missing_tool", js(tools=self.tools[:2], tool_choice={"type": "function", "function": {"name": "nope"}})),
            ("prompt_too_long", js(messages=[{"role": "user", "content": "hello " * 5000}])),
            (
                "max_tokens_below_schema",
                js(
                    max_tokens=3,
                    response_format={
                        "type": "json_schema",
                        "json_schema": {
                            "name": "x",
                            "strict": True,
                            "schema": json.loads(EXTRACT_SCHEMA_PATH.read_text()),
                        },
                    },
                ),
            ),
            ("body_too_large", js(messages=[{"role": "user", "content": "x" * (5 * 1024 * 1024)}])),
        ]

    # ------------------------------------------------------------------ one action of a client

    def failed(self, what: str, status: int, code: str | None, started: float, detail: str) -> None:
        """A 5xx, an error event in a stream, or a stream cut: with --cluster, the clear 503
        `engine_stopped` (an engine replica) or `gateway_stopped` (a gateway replica,
        gateway/cluster/proxy_errors.py) of a request a killed replica may have held is the chaos working."""
        c = self.c
        kill = self.killer.kill_near(started, time.monotonic(), self.args.kill_window) if self.killer else None
        if kill is not None:
            key = f"{kill.deployment}:{status}/{code}"
            c.killed_by_status[key] = c.killed_by_status.get(key, 0) + 1
            if status in (200, 503) and code in ("engine_stopped", "gateway_stopped"):
                c.killed_in_flight += 1
                return
        c.server_errors += 1
        c.sample(f"{what}: HTTP {status} ({code}): {detail}")

    def _record_stream(self, kind: str, r: Result, started: float, schema: dict[str, Any] | None = None) -> None:
        c = self.c
        c.status(r.status)
        if r.status >= 500:
            self.failed(kind, r.status, r.error_code, started, str(r.error))
            return
        if r.status != 200:
            c.client_errors += 1
            c.sample(f"{kind}: HTTP {r.status}: {r.error}")
            return
        if r.error is not None or not r.saw_done:
            # an error event inside the stream, or a stream cut by the server
            self.failed(kind + "/stream", r.status, r.error_code, started, f"{r.error} (done={r.saw_done})")
            return
        if kind == "agent":
            calls = [(x["name"], x["arguments"]) for _, x in sorted(r.tool_calls.items())]
            valid = tool_calls_valid(calls, self.tool_params)
        else:
            valid = json_valid(r.content, schema or self.extract_schema)
        if r.finish_reason == "length":
            c.incomplete += 1
        if valid:
            c.completed_ok += 1
        else:
            c.invalid_outputs += 1
            c.sample(f"{kind}: invalid output (finish={r.finish_reason}): {r.content[:120]} {r.tool_calls}")

    async def chat(
        self,
        client: httpx.AsyncClient,
        kind: str,
        body: dict[str, Any],
        stream: bool,
        schema: dict[str, Any] | None = None,
    ) -> None:
        started = time.monotonic()
        if not stream:
            self.c.non_streamed += 1
        call = stream_chat(client, body) if stream else post_chat(client, body)
        r = await asyncio.wait_for(call, timeout=self.args.request_timeout)
        self._record_stream(kind, r, started, schema)

    async def valid(self, client: httpx.AsyncClient, rng: random.Random) -> None:
        self.c.valid_requests += 1
        roll = rng.random()
        if roll < self.args.upload_frac:
            await self.upload(client, rng)
        elif roll < self.args.upload_frac + self.args.responses_frac:
            await self.stored_response(client, rng)
        else:
            kind, body = self.valid_body(rng)
            await self.chat(client, kind, body, stream=kind == "agent" or rng.random() < 0.5)

    async def upload(self, client: httpx.AsyncClient, rng: random.Random) -> None:
        """POST /v1/schemas a new schema, then a strict request naming it by id (streamed or not)."""
        n, self.upload_seq = self.upload_seq, self.upload_seq + 1
        schema = upload_schema(str(self.args.seed), n)
        self.c.uploads += 1
        started = time.monotonic()
        resp = await client.post("/v1/schemas", json={"name": f"soak-{n}", "schema": schema})
        self.c.status(resp.status_code)
        if resp.status_code >= 500:
            self.failed("upload", resp.status_code, error_code(resp), started, resp.text[:200])
            return
        if resp.status_code not in (200, 201):
            self.c.client_errors += 1
            self.c.sample(f"upload: HTTP {resp.status_code}: {resp.text[:200]}")
            return
        schema_id = resp.json()["id"]
        self.uploaded[schema_id] = schema
        self.c.uploads_acknowledged += 1
        name = DOCUMENT_PEOPLE[rng.randrange(4)][0]
        body = {
            "model": MODEL,
            "temperature": 0,
            "max_tokens": self.args.max_tokens,
            "schema_id": schema_id,
            "messages": [
                {"role": "system", "content": self.document},
                {"role": "user", "content": f"Extract the record of {name}."},
            ],
        }
        await self.chat(client, "registry", body, stream=rng.random() < 0.5, schema=schema)

    async def stored_response(self, client: httpx.AsyncClient, rng: random.Random) -> None:
        """/v1/responses, strict json_schema, store: true; the id must be readable at the end."""
        name = DOCUMENT_PEOPLE[rng.randrange(4)][0]
        body = {
            "model": MODEL,
            "temperature": 0,
            "max_output_tokens": self.args.max_tokens,
            "store": True,
            "instructions": self.document,
            "input": f"Extract the record of {name}.",
            "text": {
                "format": {"type": "json_schema", "name": "record", "strict": True, "schema": self.extract_schema}
            },
        }
        started = time.monotonic()
        self.c.non_streamed += 1
        resp = await client.post("/v1/responses", json=body)
        c = self.c
        c.status(resp.status_code)
        if resp.status_code >= 500:
            self.failed("responses", resp.status_code, error_code(resp), started, resp.text[:200])
            return
        if resp.status_code != 200:
            c.client_errors += 1
            c.sample(f"responses: HTTP {resp.status_code}: {resp.text[:200]}")
            return
        obj = resp.json()
        if obj.get("error"):
            self.failed("responses", resp.status_code, obj["error"].get("code"), started, str(obj["error"]))
            return
        self.stored.append(obj["id"])
        c.responses_stored += 1
        text = "".join(
            part.get("text", "")
            for item in obj.get("output", [])
            if item.get("type") == "message"
            for part in item.get("content", [])
        )
        if obj.get("status") == "incomplete":
            c.incomplete += 1
        if json_valid(text, self.extract_schema):
            c.completed_ok += 1
        else:
            c.invalid_outputs += 1
            c.sample(f"responses: invalid output (status={obj.get('status')}): {text[:120]}")

    async def read_back(self) -> None:
        """Every acknowledged upload and stored response must still be readable."""
        async with httpx.AsyncClient(base_url=self.url, timeout=60) as client:
            for schema_id in self.uploaded:
                resp = await client.get(f"/v1/schemas/{schema_id}")
                if resp.status_code != 200:
                    self.c.uploads_lost += 1
                    self.c.sample(f"upload {schema_id} lost: HTTP {resp.status_code}: {resp.text[:200]}")
            for rid in self.stored:
                resp = await client.get(f"/v1/responses/{rid}")
                if resp.status_code != 200:
                    self.c.responses_lost += 1
                    self.c.sample(f"response {rid} lost: HTTP {resp.status_code}: {resp.text[:200]}")

    async def disconnect(self, client: httpx.AsyncClient, rng: random.Random) -> None:
        kind, body = self.valid_body(rng)
        self.c.disconnects += 1
        after_events = rng.randint(1, 8)
        after_s = rng.uniform(0.2, 6.0)  # may hang up while still queued, before any event

        async def hang_up(n: int) -> bool:
            return n >= after_events

        started = time.monotonic()
        try:
            r = await asyncio.wait_for(stream_chat(client, body, on_event=hang_up), timeout=after_s)
        except TimeoutError:
            return
        if r.status >= 500:
            self.c.status(r.status)
            self.failed(f"disconnect/{kind}", r.status, r.error_code, started, str(r.error))

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
            action = (
                self.disconnect
                if roll < self.args.disconnect_frac
                else self.bad_request
                if roll < self.args.disconnect_frac + self.args.bad_frac
                else self.valid
            )
            self.c.requests += 1
            started = time.monotonic()
            try:
                await action(client, rng)
            except asyncio.CancelledError:
                self.c.cancelled_at_end += 1
                raise
            except (TimeoutError, httpx.HTTPError) as exc:
                kill = self.killer.kill_near(started, time.monotonic(), self.args.kill_window) if self.killer else None
                if kill is not None:
                    key = f"{kill.deployment}:transport/{type(exc).__name__}"
                    self.c.killed_by_status[key] = self.c.killed_by_status.get(key, 0) + 1
                self.c.transport_errors += 1
                self.c.sample(f"{action.__name__}: {type(exc).__name__}: {exc}")

    async def run(self, deadline: float) -> None:
        limits = httpx.Limits(max_connections=self.args.clients + 8, max_keepalive_connections=self.args.clients + 8)
        async with httpx.AsyncClient(
            base_url=self.url, timeout=httpx.Timeout(self.args.request_timeout, connect=30), limits=limits
        ) as client:
            tasks = [asyncio.create_task(self.client_loop(client, i, deadline)) for i in range(self.args.clients)]
            await asyncio.sleep(max(0.0, deadline - time.monotonic()))
            # the deadline: requests still in flight are cancelled (their connections close)
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


def error_code(resp: httpx.Response) -> str | None:
    try:
        return resp.json()["error"].get("code")
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
