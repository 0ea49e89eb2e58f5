"""The chat workloads of the serve bench, and what other suites reuse of it: one streamed (or
whole) chat request and its `Result`, the validity checks (tool calls, JSON), the extraction
document, the workloads themselves (agent tools, multi-turn, JSON extraction, cold unique
prompts), and two small helpers (a percentile, SIGTERM as a clean exit)."""

from __future__ import annotations

import json
import math
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

import httpx
import jsonschema

from bench.harness.server_process import MODEL
from bench.harness.workloads import ROOT, USER_TASKS, agent_system_prompt, agent_tools

EXTRACT_SCHEMA_PATH = ROOT / "tests" / "data" / "schema_corpus" / "extract_12_fields.json"
COMPLETE = ("stop", "tool_calls")


# =========================================================================== one streamed request


@dataclass
class Result:
    status: int = 0
    ttft: float | None = None
    elapsed: float = 0.0
    content: str = ""
    tool_calls: dict[int, dict[str, str]] = field(default_factory=dict)
    finish_reason: str | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    error: str | None = None
    error_code: str | None = None  # the OpenAI error object's code (e.g. engine_stopped), where one came
    saw_done: bool = False


async def stream_chat(
    client: httpx.AsyncClient, body: dict[str, Any], on_event: Callable[[int], Awaitable[bool]] | None = None
) -> Result:
    """POST a streaming chat request and collect it. `on_event(n)` (n = SSE events so far) may
    return True to hang up early (a client that disconnects mid-stream)."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    r = Result()
    t0 = time.perf_counter()
    async with client.stream("POST", "/v1/chat/completions", json=body) as resp:
        r.status = resp.status_code
        if resp.status_code != 200:
            raw = await resp.aread()
            try:
                err = json.loads(raw)["error"]
                r.error, r.error_code = err["message"], err.get("code")
            except (ValueError, KeyError, TypeError):
                r.error = raw[:200].decode(errors="replace")
            r.elapsed = time.perf_counter() - t0
            return r
        events = 0
        async for line in resp.aiter_lines():
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                r.saw_done = True
                break
            obj = json.loads(data)
            events += 1
            if "error" in obj:
                r.error = obj["error"].get("message", "stream error")
                r.error_code = obj["error"].get("code")
                continue
            if obj.get("usage"):
                u = obj["usage"]
                r.prompt_tokens = u["prompt_tokens"]
                r.completion_tokens = u["completion_tokens"]
                r.cached_tokens = (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
            for ch in obj.get("choices", []):
                d = ch.get("delta", {})
                if d.get("content"):
                    if r.ttft is None:
                        r.ttft = time.perf_counter() - t0
                    r.content += d["content"]
                for tc in d.get("tool_calls") or []:
                    if r.ttft is None:
                        r.ttft = time.perf_counter() - t0
                    call = r.tool_calls.setdefault(tc["index"], {"id": "", "name": "", "arguments": ""})
                    call["id"] = tc.get("id") or call["id"]
                    fn = tc.get("function") or {}
                    call["name"] = fn.get("name") or call["name"]
                    call["arguments"] += fn.get("arguments") or ""
                if ch.get("finish_reason"):
                    r.finish_reason = ch["finish_reason"]
            if on_event is not None and await on_event(events):
                break
    r.elapsed = time.perf_counter() - t0
    return r


async def post_chat(client: httpx.AsyncClient, body: dict[str, Any]) -> Result:
    """POST a non-streamed chat request; the same `Result` as `stream_chat` (saw_done: a whole body)."""
    r = Result()
    t0 = time.perf_counter()
    resp = await client.post("/v1/chat/completions", json={**body, "stream": False})
    r.status, r.elapsed = resp.status_code, time.perf_counter() - t0
    try:
        obj = resp.json()
    except ValueError:
        r.error = resp.text[:200]
        return r
    if resp.status_code != 200 or "error" in obj:
        err = obj.get("error") if isinstance(obj, dict) else None
        r.error = (err or {}).get("message", resp.text[:200]) if isinstance(err, dict) else resp.text[:200]
        r.error_code = err.get("code") if isinstance(err, dict) else None
        return r
    r.saw_done = True
    choice = obj["choices"][0]
    msg = choice.get("message") or {}
    r.content = msg.get("content") or ""
    for i, tc in enumerate(msg.get("tool_calls") or []):
        r.tool_calls[i] = {
            "id": tc.get("id", ""),
            "name": tc["function"]["name"],
            "arguments": tc["function"]["arguments"],
        }
    r.finish_reason = choice.get("finish_reason")
    u = obj.get("usage") or {}
    r.prompt_tokens, r.completion_tokens = u.get("prompt_tokens", 0), u.get("completion_tokens", 0)
    return r


# =========================================================================== validity checks


def tool_calls_valid(calls: list[tuple[str, str]], tool_params: dict[str, dict]) -> bool:
    """At least one call; each names a known tool and has arguments valid for its parameters."""
    if not calls:
        return False
    for name, arguments in calls:
        if name not in tool_params:
            return False
        try:
            jsonschema.validate(json.loads(arguments), tool_params[name])
        except (ValueError, jsonschema.ValidationError):
            return False
    return True


def json_valid(text: str, schema: dict) -> bool:
    try:
        jsonschema.validate(json.loads(text), schema)
        return True
    except (ValueError, jsonschema.ValidationError):
        return False


# =========================================================================== workloads


DOCUMENT_PEOPLE = [
    (
        "Maria Lopez",
        "Senior Data Engineer",
        "Northwind Logistics",
        "logistics",
        "northwind.example",
        "Madrid",
        ["Python", "Spark", "SQL"],
        ["Spanish", "English"],
        ["Iberia Freight", "DataCo"],
    ),
    (
        "Ken Sato",
        "Creative Director",
        "Sato Design",
        "graphic design",
        "sato-design.example",
        "Osaka",
        ["branding", "typography"],
        ["Japanese", "English"],
        ["Dentsu"],
    ),
    (
        "Amina Okafor",
        "Head of Research",
        "Lagos Health",
        "healthcare",
        "lagoshealth.example",
        "Lagos",
        ["epidemiology", "R", "statistics"],
        ["English", "Yoruba"],
        ["WHO", "Lagos University Hospital"],
    ),
    (
        "Lars Nilsen",
        "Fleet Manager",
        "Fjord Shipping",
        "maritime transport",
        "fjordship.example",
        "Bergen",
        ["route planning", "safety audits"],
        ["Norwegian", "English", "German"],
        ["Hurtigruten"],
    ),
    (
        "Priya Raman",
        "Product Manager",
        "Cloudlet",
        "software",
        "cloudlet.example",
        "Bangalore",
        ["roadmaps", "user research"],
        ["Tamil", "English", "Hindi"],
        ["Infosys", "Flipkart"],
    ),
    (
        "Tomasz Wrobel",
        "Chief Accountant",
        "Vistula Foods",
        "food production",
        "vistulafoods.example",
        "Krakow",
        ["IFRS", "audits"],
        ["Polish", "English"],
        ["KPMG"],
    ),
    (
        "Sofia Greco",
        "Architect",
        "Studio Greco",
        "architecture",
        "studiogreco.example",
        "Milan",
        ["CAD", "sustainable design"],
        ["Italian", "English", "French"],
        ["Renzo Piano Building Workshop"],
    ),
    (
        "Diego Fuentes",
        "Sales Lead",
        "Andes Mining Supply",
        "mining equipment",
        "andesmining.example",
        "Santiago",
        ["negotiation", "CRM"],
        ["Spanish", "English"],
        ["Komatsu Chile"],
    ),
]


def extract_document() -> str:
    parts = ["Staff directory of the Harbor Consortium partner companies (confidential).\n"]
    for i, (name, title, company, industry, site, city, skills, langs, prev) in enumerate(DOCUMENT_PEOPLE):
        first = name.split()[0]
        parts.append(
            f"Profile {i + 1}. {name} works as {title} at {company}, a {industry} company headquartered in {city} "
            f"(website https://www.{site}). {first} can be reached at {first.lower()}@{site} or by phone at "
            f"+{30 + i} 555 01{i:02d} {i * 7 % 10}{i * 3 % 10}. Skills: {', '.join(skills)}. Languages: "
            f"{', '.join(langs)}. Previously at {', '.join(prev)}. {first} joined {company} in {2010 + i} and "
            f"mentors new staff on {skills[0]}.\n"
        )
    return "".join(parts)


def agent_messages(system: str, i: int) -> list[dict]:
    return [{"role": "system", "content": system}, {"role": "user", "content": USER_TASKS[i % len(USER_TASKS)]}]


def extract_messages(doc: str, i: int) -> list[dict]:
    name = DOCUMENT_PEOPLE[i % len(DOCUMENT_PEOPLE)][0]
    return [
        {"role": "system", "content": doc},
        {"role": "user", "content": f"Extract the record of {name} from the directory."},
    ]


def cold_messages(i: int) -> list[dict]:
    lang = ["French", "Spanish", "German", "Italian"][i % 4]
    return [
        {
            "role": "user",
            "content": f"Unique request {i}: describe the number {i * 7919 + 13} in {lang} words, "
            f"then name {i % 5 + 2} animals whose names start with the letter "
            f"{chr(65 + i % 26)}.",
        }
    ]


@dataclass
class Workload:
    name: str
    jobs: list[Callable[[httpx.AsyncClient], Awaitable[list[tuple[Result, bool]]]]]
    concurrency: int


def build_workloads(tok, n: int, concurrency: int, max_tokens: int) -> list[Workload]:
    common = {"model": MODEL, "temperature": 0, "max_tokens": max_tokens}
    tools = agent_tools()
    tool_params = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    system = agent_system_prompt(tok, 1500)
    extract_schema = json.loads(EXTRACT_SCHEMA_PATH.read_text())
    doc = extract_document()

    def single(body: dict, check: Callable[[Result], bool]):
        async def job(client: httpx.AsyncClient) -> list[tuple[Result, bool]]:
            r = await stream_chat(client, body)
            return [(r, check(r))]

        return job

    def agent_check(r: Result) -> bool:
        return tool_calls_valid([(c["name"], c["arguments"]) for _, c in sorted(r.tool_calls.items())], tool_params)

    agent = [
        single(
            {**common, "messages": agent_messages(system, i), "tools": tools, "tool_choice": "required"}, agent_check
        )
        for i in range(n)
    ]
    extract = [
        single(
            {
                **common,
                "messages": extract_messages(doc, i),
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "record", "strict": True, "schema": extract_schema},
                },
            },
            lambda r: json_valid(r.content, extract_schema),
        )
        for i in range(n)
    ]
    cold = [single({**common, "messages": cold_messages(i)}, lambda r: bool(r.content.strip())) for i in range(n)]

    conversations = max(1, min(concurrency, n))
    turns = [n // conversations + (1 if c < n % conversations else 0) for c in range(conversations)]

    def conversation(c: int, num_turns: int):
        async def job(client: httpx.AsyncClient) -> list[tuple[Result, bool]]:
            msgs = [
                {
                    "role": "system",
                    "content": f"You are tutor #{c} for a student learning geography. "
                    "Answer in two or three sentences.",
                }
            ]
            out = []
            for t in range(num_turns):
                msgs.append(
                    {
                        "role": "user",
                        "content": f"Question {t + 1}: what is notable about country number "
                        f"{c * 7 + t} on your list, and why?",
                    }
                )
                r = await stream_chat(client, {**common, "messages": msgs})
                out.append((r, bool(r.content.strip())))
                msgs.append({"role": "assistant", "content": r.content})
            return out

        return job

    multi = [conversation(c, k) for c, k in enumerate(turns) if k]
    return [
        Workload("agent-tools", agent, concurrency),
        Workload("multi-turn", multi, conversations),
        Workload("json-extract", extract, concurrency),
        Workload("cold-unique", cold, concurrency),
    ]


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    k = (len(s) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def exit_on_sigterm() -> None:
    """SIGTERM → SystemExit, so `with JumpgateServer(...)` and atexit still stop the server."""
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
