"""A ReAct-style agent loop against Jumpgate with the official `openai` client.

The model is given three local Python tools (a calculator, a clock and a tiny fake search over a
dict). Each turn it either calls tools (Jumpgate constrains the output to valid calls: the names
exist and the arguments match each tool's JSON schema) or answers. Tool results go back as
role=tool messages, and the loop stops when the model answers or after --max-turns turns; the
last turn then asks for an answer with tool_choice "none".

    make run                                   # in another terminal
    python examples/react_agent.py --task "What is 17.5% of 2340?"

Environment: JUMPGATE_BASE_URL (default http://127.0.0.1:8000/v1), JUMPGATE_API_KEY,
JUMPGATE_MODEL (default: the first model the server lists).
"""

from __future__ import annotations

import argparse
import ast
import datetime as dt
import json
import operator
import os
import sys
from typing import Any, Callable

from openai import OpenAI

# --------------------------------------------------------------------------- local tools

_OPS: dict[type, Callable[..., float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
    ast.Mod: operator.mod,
    ast.FloorDiv: operator.floordiv,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def _eval(node: ast.AST) -> float:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > 100:
            raise ValueError("exponent too large")
        return _OPS[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.operand))
    raise ValueError(f"unsupported expression element: {type(node).__name__}")


def calculator(expression: str) -> str:
    """Arithmetic only (no names, no calls): safe to run on model output."""
    value = _eval(ast.parse(expression.replace("^", "**"), mode="eval"))
    return str(round(value, 10)) if isinstance(value, float) else str(value)


def clock(timezone: str = "UTC") -> str:
    offsets = {"UTC": 0, "CET": 1, "EET": 2, "JST": 9, "EST": -5, "PST": -8}
    hours = offsets.get(timezone.upper())
    if hours is None:
        return f"unknown time zone {timezone!r}; known: {', '.join(offsets)}"
    now = dt.datetime.now(dt.timezone(dt.timedelta(hours=hours)))
    return now.strftime(f"%Y-%m-%d %H:%M:%S {timezone.upper()}")


FACTS = {
    "jumpgate": "Jumpgate is a structured-output LLM gateway with an OpenAI-compatible API.",
    "radixattention": "RadixAttention keeps KV cache prefixes in a radix tree so prompts that share a prefix reuse it.",
    "xgrammar": "XGrammar compiles JSON schemas and grammars into token masks for constrained decoding.",
    "paris": "Paris is the capital of France; about 2.1 million people live in the city proper.",
    "everest": "Mount Everest is 8,849 metres high.",
}


def search(query: str) -> str:
    words = {w.strip(".,?!'\"").lower() for w in query.split()}
    hits = [text for key, text in FACTS.items() if key in words or key in query.lower()]
    return " ".join(hits) if hits else f"no results for {query!r}"


TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression (+ - * / ^ and parentheses).",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string", "pattern": "^[0-9+\\-*/^(). %]{1,100}$"}},
                "required": ["expression"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "clock",
            "description": "The current date and time in a time zone.",
            "parameters": {
                "type": "object",
                "properties": {"timezone": {"type": "string", "enum": ["UTC", "CET", "EET", "JST", "EST", "PST"]}},
                "required": ["timezone"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search a small encyclopedia.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string", "minLength": 1, "maxLength": 80}},
                "required": ["query"],
                "additionalProperties": False,
            },
        },
    },
]
LOCAL_TOOLS: dict[str, Callable[..., str]] = {"calculator": calculator, "clock": clock, "search": search}

SYSTEM = (
    "You are a careful assistant. Think step by step. Use the tools when they help: the calculator "
    "for arithmetic, the clock for the time, search for facts. When you have the answer, reply in "
    "one or two sentences without calling a tool."
)


def run_tool(name: str, arguments: str) -> str:
    fn = LOCAL_TOOLS.get(name)
    if fn is None:
        return f"error: unknown tool {name!r}"
    try:
        return fn(**json.loads(arguments))
    except Exception as exc:  # a tool error is an observation the model can react to
        return f"error: {exc}"


def react(client: OpenAI, model: str, task: str, max_turns: int, max_tokens: int) -> str:
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task}]
    for turn in range(1, max_turns + 1):
        last = turn == max_turns
        # First turn: act (required). Then the model decides (auto). Last turn: answer (none).
        choice = "none" if last else ("required" if turn == 1 else "auto")
        resp = client.chat.completions.create(
            model=model,
            messages=messages,
            tools=TOOLS,
            tool_choice=choice,  # type: ignore[arg-type]
            parallel_tool_calls=False,
            temperature=0,
            max_tokens=max_tokens,
        )
        msg = resp.choices[0].message
        cached = (
            resp.usage.prompt_tokens_details.cached_tokens if resp.usage and resp.usage.prompt_tokens_details else 0
        )
        print(
            f"--- turn {turn} (tool_choice={choice}, finish={resp.choices[0].finish_reason}, "
            f"cached prompt tokens={cached})"
        )
        if not msg.tool_calls:
            answer = (msg.content or "").strip()
            print(f"answer: {answer}")
            return answer
        messages.append(
            {
                "role": "assistant",
                "content": msg.content,
                "tool_calls": [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.function.name, "arguments": c.function.arguments},
                    }
                    for c in msg.tool_calls
                ],
            }
        )
        for call in msg.tool_calls:
            result = run_tool(call.function.name, call.function.arguments)
            print(f"action: {call.function.name}({call.function.arguments})\nobservation: {result}")
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return ""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="What is 1234 * 5678? Use the calculator.")
    ap.add_argument("--max-turns", type=int, default=int(os.environ.get("JUMPGATE_MAX_TURNS", "4")))
    ap.add_argument("--max-tokens", type=int, default=128)
    args = ap.parse_args(argv)
    client = OpenAI(
        base_url=os.environ.get("JUMPGATE_BASE_URL", "http://127.0.0.1:8000/v1"),
        api_key=os.environ.get("JUMPGATE_API_KEY", "not-needed"),
    )
    model = os.environ.get("JUMPGATE_MODEL") or client.models.list().data[0].id
    print(f"task: {args.task}")
    react(client, model, args.task, max(1, args.max_turns), args.max_tokens)
    return 0


if __name__ == "__main__":
    sys.exit(main())
