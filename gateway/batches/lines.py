"""A batch's input file: its lines checked as OpenAI checks them, and the order they run in.

Each line is `{"custom_id", "method": "POST", "url", "body"}`; a file with any bad line (not JSON,
a missing or repeated custom_id, another method or url than the batch's endpoint, a body that is
not an object) fails the batch while validating, every bad line listed (`BatchError.line`, 1-based).

Order: lines that share a prompt prefix run together, the longest shared prefix first, so the
radix cache computes each shared prefix once and the lines in flight hit it. A line's prefix key
follows the order the prompt is rendered in (gateway/pipeline/prompt.py: system → tools/schema text →
conversation) without rendering it: the instructions (system messages, response format, tools)
then the conversation up to its last message; text completions split the prompt at its last line.
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any, Iterable

import msgspec
from msgspec import Struct

from gateway.batches.objects import BatchError

MAX_ERRORS = 100  # errors listed on a failed batch (OpenAI lists a bounded number too)


class BatchLine(Struct, kw_only=True):
    index: int  # 0-based line number in the input file
    custom_id: str
    url: str
    body: dict[str, Any]


def parse_lines(data: bytes, endpoint: str, max_lines: int) -> tuple[list[BatchLine], list[BatchError]]:
    lines: list[BatchLine] = []
    errors: list[BatchError] = []
    seen: set[str] = set()

    def bad(code: str, message: str, number: int, param: str | None = None) -> None:
        if len(errors) < MAX_ERRORS:
            errors.append(BatchError(code=code, message=message, param=param, line=number))

    raw_lines = data.split(b"\n")
    for number, raw in enumerate(raw_lines, 1):
        if not raw.strip():
            continue
        try:
            obj = msgspec.json.decode(raw)
        except msgspec.DecodeError as e:
            bad("invalid_json_line", f"This line is not parseable as valid JSON: {e}", number)
            continue
        if not isinstance(obj, dict):
            bad("invalid_request", "Each line must be a JSON object.", number)
            continue
        custom_id = obj.get("custom_id")
        if not isinstance(custom_id, str) or not custom_id:
            bad(
                "missing_required_parameter",
                "Missing required parameter: 'custom_id' (a non-empty string).",
                number,
                "custom_id",
            )
            continue
        if custom_id in seen:
            bad(
                "duplicate_custom_id",
                f"The custom_id {custom_id!r} is used by an earlier line; each line needs its own.",
                number,
                "custom_id",
            )
            continue
        seen.add(custom_id)
        if obj.get("method") != "POST":
            bad("invalid_method", "The 'method' of each line must be 'POST'.", number, "method")
            continue
        if obj.get("url") != endpoint:
            bad(
                "mismatched_url",
                f"The 'url' of this line ({obj.get('url')!r}) is not the batch's endpoint {endpoint!r}.",
                number,
                "url",
            )
            continue
        body = obj.get("body")
        if not isinstance(body, dict):
            bad("invalid_request", "The 'body' of each line must be a JSON object.", number, "body")
            continue
        lines.append(BatchLine(index=number - 1, custom_id=custom_id, url=endpoint, body=body))
    if not lines and not errors:
        errors.append(BatchError(code="empty_file", message="The input file has no requests.", line=None))
    if len(lines) > max_lines:
        errors.append(
            BatchError(
                code="too_many_requests",
                message=f"The input file has {len(lines)} requests; a batch holds at most {max_lines}.",
                line=None,
            )
        )
    return lines, errors


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def prefix_key(line: BatchLine) -> tuple[str, str]:
    """(the part of the prompt this line may share with others, the rest)."""
    body = line.body
    if "messages" in body:
        messages = body.get("messages") if isinstance(body.get("messages"), list) else []
        system = [m for m in messages if isinstance(m, dict) and m.get("role") in ("system", "developer")]
        turns = [m for m in messages if not (isinstance(m, dict) and m.get("role") in ("system", "developer"))]
        head = _canonical(
            [
                body.get("model"),
                system,
                body.get("response_format"),
                body.get("tools"),
                body.get("tool_choice"),
                turns[:-1],
            ]
        )
        return head, _canonical(turns[-1:])
    prompt = body.get("prompt")
    text = prompt if isinstance(prompt, str) else _canonical(prompt)
    cut = text.rfind("\n") + 1
    return _canonical([body.get("model"), body.get("response_format")]) + text[:cut], text[cut:]


def run_order(lines: Iterable[BatchLine]) -> list[BatchLine]:
    """Lines grouped by shared prefix: the group whose shared prefix saves most (its length times the
    lines after the first) first, each group's lines sorted by the rest of their prompt, ties in
    file order."""
    groups: dict[str, list[tuple[str, BatchLine]]] = defaultdict(list)
    for line in lines:
        head, rest = prefix_key(line)
        groups[head].append((rest, line))
    ordered = sorted(groups.items(), key=lambda kv: (-len(kv[0]) * (len(kv[1]) - 1), kv[1][0][1].index))
    out: list[BatchLine] = []
    for _, members in ordered:
        out.extend(line for _, line in sorted(members, key=lambda m: (m[0], m[1].index)))
    return out
