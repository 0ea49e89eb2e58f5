"""The fidelity bench's side of the wire: schema checks and strict requests, and the server kept
alive under a memory limit (bench/suites/structured/fidelity.py runs them and judges the answers)."""

from __future__ import annotations

import asyncio
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import httpx

from bench.fidelity.corpus import Entry
from bench.harness.server_process import MODEL, JumpgateServer, ServerFailed, parse_metrics
from grammar.validation.fidelity import DUPLICATE_KEYS, ENFORCED, XGRAMMAR

COMPILE_SECONDS = "jumpgate_grammar_compile_seconds_total"
SERVER_MEMORY, NOT_ASKED = "server_memory", "not_asked"  # the bench's own codes
PROMPT_TOO_LONG = "context_length_exceeded"  # the server's code for a prompt past the context
DECODE_HEADER = "x-jumpgate-decode-ms-per-token"  # gateway/http/access_log.py
_MESSAGE = 300


@dataclass
class Check:
    """What POST /v1/schemas/check said about one schema."""

    status: int
    engine: str | None = None  # xgrammar / llguidance (None: the check itself was refused)
    strict_accepted: bool = False
    keywords: list[str] = field(default_factory=list)  # what strict mode refuses
    code: str | None = None
    message: str | None = None
    compile_ms: float | None = None
    check_ms: float = 0.0


@dataclass
class Answer:
    """One chat completion's outcome as the client saw it."""

    status: int  # 0: no HTTP answer (transport error, or not asked)
    content: str | None = None
    finish_reason: str | None = None
    code: str | None = None
    message: str | None = None
    server_valid: bool | None = None  # the choice's jumpgate.schema_valid
    closed_at_budget: bool = False  # the choice's jumpgate.closed_at_budget: strict closing completed it
    prompt_tokens: int = 0
    completion_tokens: int = 0
    elapsed: float = 0.0
    # the server's mean decode step, ms per output token from the first to the last (no queueing,
    # no prefill): its x-jumpgate-decode-ms-per-token header (None: under two tokens)
    decode_ms: float | None = None


def short(text: Any) -> str | None:
    return None if text is None else str(text)[:_MESSAGE]


def _error(data: Any) -> tuple[str | None, str | None]:
    error = data.get("error") if isinstance(data, dict) else None
    return (error.get("code"), error.get("message")) if isinstance(error, dict) else (None, None)


def _json(resp: httpx.Response) -> Any:
    try:
        return resp.json()
    except ValueError:
        return {"error": {"message": resp.text[:_MESSAGE]}}


def read_check(status: int, data: Any, compile_ms: float | None, check_ms: float) -> Check:
    """A check from the route's answer (200: its SchemaCheck; else its error object)."""
    if status != 200 or not isinstance(data, dict) or "fidelity" not in data:
        code, message = _error(data)
        return Check(status, code=code, message=short(message), compile_ms=compile_ms, check_ms=check_ms)
    fidelity = data["fidelity"]
    keywords = [
        k["keyword"]
        for k in fidelity.get("keywords", [])
        if k.get("status") != ENFORCED and k.get("keyword") != DUPLICATE_KEYS
    ]
    accepted = bool(data.get("strict_accepted"))
    return Check(
        status,
        engine=fidelity.get("engine", XGRAMMAR),
        strict_accepted=accepted,
        keywords=[] if accepted else sorted(set(keywords)),
        message=short(data.get("strict_refusal")),
        compile_ms=compile_ms,
        check_ms=check_ms,
    )


# =========================================================================== the server, guarded


class ServerGuard:
    """The bench's server under a memory limit: a thread reads its RSS every 0.2 s and stops it (by
    PID, SIGKILL a second after SIGTERM) past `limit_mb`; `ensure_up` starts it again on the same
    port, at most `max_restarts` times. Without it one corpus schema could take the machine's
    memory (SchemaStore's azure-pipelines: its compile goes on past the time limit and the server
    grew past 20 GB until the kernel's OOM killer stopped it)."""

    def __init__(self, server: JumpgateServer, limit_mb: float, max_restarts: int = 5):
        self.server = server
        self.limit_mb = limit_mb
        self.max_restarts = max_restarts
        self.kills = 0
        self.restarts = 0
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="fidelity-memory-guard", daemon=True)

    @property
    def up(self) -> bool:
        proc = self.server.proc
        return proc is not None and proc.poll() is None

    def _watch(self) -> None:
        while not self._done.wait(0.2):
            with self._lock:
                if not self.up:
                    continue
                try:
                    over = self.server.rss_mb() > self.limit_mb
                except (OSError, AssertionError):
                    continue
                if over:
                    self.kills += 1
                    self.server.stop(timeout_s=1.0)

    def ensure_up(self) -> bool:
        """True once the server answers again (False: out of restarts, or it would not start)."""
        with self._lock:
            if self.up:
                return True
            if self.restarts >= self.max_restarts:
                return False
            self.restarts += 1
            try:
                self.server.restart()
            except ServerFailed:
                return False
            return True

    def __enter__(self) -> ServerGuard:
        self.server.start()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join()
        self.server.stop()


# =========================================================================== checks


async def _metrics(client: httpx.AsyncClient) -> dict[str, float]:
    try:
        return parse_metrics((await client.get("/metrics")).text)
    except httpx.HTTPError:
        return {}


async def check_all(client: httpx.AsyncClient, entries: list[Entry], guard: ServerGuard | None = None) -> list[Check]:
    """One check at a time, so each compile-time rise in /metrics is that schema's."""
    out = []
    before = (await _metrics(client)).get(COMPILE_SECONDS, 0.0)
    for entry in entries:
        kills = guard.kills if guard else 0
        t0 = time.perf_counter()
        try:
            resp = await client.post("/v1/schemas/check", json={"schema": entry.schema, "strict": True})
            status, data = resp.status_code, _json(resp)
        except httpx.HTTPError as exc:
            status, data = 0, {"error": {"message": f"{type(exc).__name__}: {exc}"}}
        check_ms = (time.perf_counter() - t0) * 1e3
        metrics = await _metrics(client)  # a compile past its limit was killed: nothing runs on
        after = metrics.get(COMPILE_SECONDS, before)
        check = read_check(status, data, (after - before) * 1e3 if after > before else None, check_ms)
        if guard is not None and (guard.kills > kills or not guard.up):
            check = Check(
                0,
                code=SERVER_MEMORY if guard.kills > kills else "server_died",
                check_ms=check_ms,
                message=f"the server passed {guard.limit_mb:.0f} MB and was stopped"
                if guard.kills > kills
                else "the server exited during the check",
            )
            await asyncio.to_thread(guard.ensure_up)
            after = (await _metrics(client)).get(COMPILE_SECONDS, 0.0)  # a new process counts from 0
        out.append(check)
        before = after
    return out


# =========================================================================== answers


def request_text(entry: Entry) -> str:
    name = entry.name.split(":", 1)[-1].split("#")[0]  # BFCL's "category:function", a repeat's "#2"
    what = {
        "kubernetes": f"a Kubernetes {name} object",
        "schemastore": f"{name} configuration file",
        "bfcl": f"the arguments of a call to the function {name}",
    }.get(entry.source, name.replace("_", " "))
    if not what.startswith(("a ", "the ")):
        what = ("an " if what[:1].lower() in "aeiou" else "a ") + what
    return f"Write one realistic example of {what}, as JSON."


def chat_body(entry: Entry, max_tokens: int) -> dict[str, Any]:
    name = re.sub(r"[^A-Za-z0-9_-]+", "_", entry.name)[:64] or "schema"
    return {
        "model": MODEL,
        "temperature": 0,
        "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": request_text(entry)}],
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": name, "strict": True, "schema": entry.schema},
        },
    }


async def answer_one(client: httpx.AsyncClient, entry: Entry, max_tokens: int) -> Answer:
    t0 = time.perf_counter()
    try:
        resp = await client.post("/v1/chat/completions", json=chat_body(entry, max_tokens))
    except httpx.HTTPError as exc:
        return Answer(0, message=f"{type(exc).__name__}: {exc}", elapsed=time.perf_counter() - t0)
    elapsed = time.perf_counter() - t0
    data = _json(resp)
    if resp.status_code != 200:
        code, message = _error(data)
        return Answer(resp.status_code, code=code, message=message, elapsed=elapsed)
    choice = data["choices"][0]
    usage = data.get("usage") or {}
    extension = choice.get("jumpgate") or {}
    return Answer(
        200,
        content=choice["message"].get("content") or "",
        finish_reason=choice.get("finish_reason"),
        server_valid=extension.get("schema_valid"),
        closed_at_budget=bool(extension.get("closed_at_budget")),
        prompt_tokens=usage.get("prompt_tokens", 0),
        completion_tokens=usage.get("completion_tokens", 0),
        elapsed=elapsed,
        decode_ms=_float(resp.headers.get(DECODE_HEADER)),
    )


def _float(text: str | None) -> float | None:
    try:
        return None if text is None else float(text)
    except ValueError:
        return None


async def answer_all(
    client: httpx.AsyncClient,
    entries: list[Entry],
    max_tokens: int,
    concurrency: int,
    guard: ServerGuard | None = None,
    skip: frozenset[tuple[str, str]] = frozenset(),
    on_answer: Callable[[Entry, Answer], None] | None = None,
) -> list[Answer]:
    """`concurrency` requests at a time. With a guard, a request that lost the server (stopped over
    memory, or crashed) is sent once more after the server is back; `skip` holds the (source, name)
    of schemas whose check already took the server past its memory limit (not asked again).
    `on_answer` is called with each entry's final answer as soon as it is in (completion order)."""
    sem = asyncio.Semaphore(concurrency)
    restart = asyncio.Lock()

    async def ask(entry: Entry) -> Answer:
        if (entry.source, entry.name) in skip:
            return Answer(0, code=NOT_ASKED, message="its check took the server past the memory limit")
        async with sem:
            answer = await answer_one(client, entry, max_tokens)
            if answer.status == 0 and guard is not None:
                async with restart:
                    up = await asyncio.to_thread(guard.ensure_up)
                if up:
                    answer = await answer_one(client, entry, max_tokens)
            return answer

    async def one(entry: Entry) -> Answer:
        answer = await ask(entry)
        if on_answer is not None:
            on_answer(entry, answer)
        return answer

    return list(await asyncio.gather(*(one(e) for e in entries)))
