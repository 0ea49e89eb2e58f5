"""bench/suites/structured/fidelity.py without the real model: each answer's verdict (valid, invalid, cut off,
refused, duplicate keys) on hand-made responses, the check report's reading, the corpus sample,
the summary and detail lines; then the client side against the real gateway app over the scripted
fake engine (real grammar service), so check and answer parsing meet the routes' real answers."""

from __future__ import annotations

import asyncio
import json

import pytest

from bench.fidelity.client import Answer, Check, answer_all, chat_body, check_all, read_check
from bench.fidelity.corpus import Entry, select
from bench.fidelity.tally import answer_lines, answered, refused, tally
from bench.suites.structured.fidelity import (
    AnswerLog,
    Row,
    answer_line,
    classify,
    decode_steps,
    detail,
    parse_args,
    pick,
    summarize,
)

SCHEMA = {
    "type": "object",
    "properties": {"n": {"type": "integer", "minimum": 0}, "mail": {"type": "string", "format": "email"}},
    "required": ["n"],
    "additionalProperties": False,
}


def ok(content: str, finish_reason: str = "stop") -> Answer:
    return Answer(200, content=content, finish_reason=finish_reason)


@pytest.mark.parametrize(
    "answer,outcome,duplicate",
    [
        (ok('{"n": 1}'), "valid", False),
        (ok('{"n":1,"mail":"a@b.co"}'), "valid", False),
        (ok('{"n": -1}'), "invalid", False),  # minimum
        (ok('{"n": 1, "mail": "not an address"}'), "invalid", False),  # format, checked as the gateway does
        (ok('{"n": 1, "extra": 2}'), "invalid", False),
        (ok('{"n": 1, "n": 2}'), "invalid", True),  # valid once parsed: only the raw text shows it
        (ok('{"n": 1, "n": 1, "x": 0}'), "invalid", True),
        (ok('{"n": 1'), "invalid", False),  # not JSON, and not cut off
        (ok('{"n": 12', "length"), "cut_off", False),
        (ok('{"n": 1}', "length"), "valid", False),  # closed in time: the value counts
        (ok('{"n": 1, "n": 2', "length"), "cut_off", False),  # unparsed: no duplicate check
    ],
)
def test_answer_verdicts(answer, outcome, duplicate):
    verdict = classify(SCHEMA, answer)
    assert (verdict.outcome, verdict.duplicate_keys) == (outcome, duplicate)
    assert (verdict.message is None) == (outcome == "valid")


def test_nested_duplicate_keys_are_found():
    schema = {"type": "object", "properties": {"a": {"type": "array", "items": {"type": "object"}}}}
    assert classify(schema, ok('{"a": [{}, {"k": 1, "k": 1}]}')).duplicate_keys


def test_refusals_and_errors():
    too_long = classify(SCHEMA, Answer(400, code="context_length_exceeded", message="prompt too long"))
    assert too_long.outcome == "refused" and too_long.prompt_length
    assert "context_length_exceeded" in too_long.message
    strict = classify(SCHEMA, Answer(400, code="schema_not_enforceable", message="not masked: 'not'"))
    assert strict.outcome == "refused" and not strict.prompt_length
    assert classify(SCHEMA, Answer(503, message="overloaded")).outcome == "error"
    assert classify(SCHEMA, Answer(0, message="ConnectError")).outcome == "error"


def test_check_report_reading():
    report = {
        "fidelity": {
            "guaranteed": False,
            "engine": "llguidance",
            "keywords": [
                {"pointer": "", "keyword": "type", "status": "enforced"},
                {"pointer": "", "keyword": "duplicate keys", "status": "checked"},
            ],
        },
        "strict_accepted": True,
    }
    c = read_check(200, report, 1.5, 3.0)
    assert (c.engine, c.strict_accepted, c.keywords, c.compile_ms) == ("llguidance", True, [], 1.5)
    refused = {
        "fidelity": {
            "keywords": [
                {"pointer": "/a", "keyword": "not", "status": "unenforced"},
                {"pointer": "/b", "keyword": "not", "status": "unenforced"},
                {"pointer": "", "keyword": "if", "status": "checked"},
                {"pointer": "", "keyword": "duplicate keys", "status": "checked"},
            ]
        },
        "strict_accepted": False,
        "strict_refusal": "Invalid schema: ...",
    }
    c = read_check(200, refused, None, 2.0)
    assert (c.engine, c.strict_accepted, c.keywords) == ("xgrammar", False, ["if", "not"])
    bad = read_check(400, {"error": {"code": "invalid_schema", "message": "bad type"}}, None, 1.0)
    assert (bad.engine, bad.code, bad.message) == (None, "invalid_schema", "bad type")


def entries(source: str, n: int) -> list[Entry]:
    return [Entry(source, f"{source}{i}", {"type": "integer", "minimum": i}) for i in range(n)]


def test_select_spreads_each_source_then_limits():
    corpus = entries("a", 10) + entries("b", 2)
    assert [e.name for e in select(corpus, ["a", "b"], 3, None)] == ["a0", "a3", "a6", "b0", "b1"]
    assert [e.name for e in select(corpus, ["b"], None, None)] == ["b0", "b1"]
    assert len(select(corpus, ["a", "b"], None, 4)) == 4


def test_chat_body_is_strict_greedy_and_named_safely():
    body = chat_body(Entry("bfcl", "live_multiple:weather.get#2", SCHEMA), 384)
    rf = body["response_format"]["json_schema"]
    assert rf == {"name": "live_multiple_weather_get_2", "strict": True, "schema": SCHEMA}
    assert body["temperature"] == 0 and body["max_tokens"] == 384
    assert "weather.get" in body["messages"][0]["content"]


def test_summary_and_details():
    xgr = Check(200, engine="xgrammar", strict_accepted=True, compile_ms=4.0, check_ms=5.0)
    llg = Check(200, engine="llguidance", strict_accepted=True, compile_ms=8.0, check_ms=9.0)
    no = Check(200, engine="xgrammar", strict_accepted=False, keywords=["not"], check_ms=1.0)
    bad = Check(400, code="invalid_schema", check_ms=1.0)
    cases = [
        (xgr, ok('{"n": 1}')),
        (llg, ok('{"n": 1, "n": 1}')),
        (xgr, ok('{"n": 3', "length")),
        (xgr, ok('{"n": 2}', "length")),
        (xgr, Answer(200, content='{"n": 4}', finish_reason="stop", closed_at_budget=True)),
        (no, Answer(400, code="schema_not_enforceable", message="no")),
        (bad, Answer(400, code="invalid_schema", message="bad")),
        (xgr, Answer(400, code="context_length_exceeded", message="long")),
    ]
    rows = [Row(Entry("s", f"e{i}", SCHEMA), c, a, classify(SCHEMA, a)) for i, (c, a) in enumerate(cases)]
    rows[0].mask_us = 10.0
    s = summarize(rows)
    assert (s["n"], s["by_xgrammar"], s["by_llguidance"], s["strict_refused"]) == (8, 5, 1, 1)
    assert s["check_refused"] == {"invalid_schema": 1} and s["top_refused_keywords"] == [("not", 1)]
    assert (s["valid"], s["invalid"], s["cut_off"], s["refused"], s["error"]) == (3, 1, 1, 3, 0)
    assert s["valid_at_length"] == 1  # the valid one that says `length`, not the cut one
    assert s["closed_at_budget"] == 1
    assert s["refused_by_code"] == {"context_length_exceeded": 1, "invalid_schema": 1, "schema_not_enforceable": 1}
    assert (s["prompt_length_refusals"], s["duplicate_keys"]) == (1, 1)
    assert s["compile_ms_p50"] == 4.0 and s["mask_us_per_token_p50"] == 10.0 and s["mask_samples"] == 1
    assert s["answered_validly_frac"] == pytest.approx(3 / 8)
    json.dumps(s)
    lines = [detail(r) for r in rows]
    assert lines[0] is None
    assert lines[1]["outcome"] == "invalid" and lines[1]["duplicate_keys"] is True
    assert lines[2]["outcome"] == "cut_off" and lines[3] is None and lines[4] is None
    assert lines[5]["refused_keywords"] == ["not"]
    assert all(line["kind"] == "detail" and line["name"] for line in lines[1:] if line is not None)


def test_decode_steps_say_the_median_the_slowest_schema_and_their_ratio():
    xgr = Check(200, engine="xgrammar", strict_accepted=True)
    steps = [20.0, 30.0, 40.0, None, 200.0]
    rows = [
        Row(Entry("s", f"e{i}", SCHEMA), xgr, a, classify(SCHEMA, a))
        for i, a in enumerate(
            Answer(200, content='{"n": 1}', finish_reason="stop", completion_tokens=9, decode_ms=ms) for ms in steps
        )
    ]
    rows.append(Row(Entry("s", "refused", SCHEMA), xgr, Answer(400, decode_ms=900.0), classify(SCHEMA, Answer(400))))
    s = decode_steps(rows)  # the untimed answer and the refusal are left out
    assert s == {
        "decode_ms_per_token_p50": 35.0,
        "decode_slowest_over_p50": 5.71,
        "decode_slowest": {"name": "e4", "ms_per_token": 200.0, "completion_tokens": 9},
    }
    spent = Answer(422, code="value_retries_exhausted", message="the output kept breaking 'pattern'")
    rows.append(Row(Entry("s", "spent", SCHEMA), xgr, spent, classify(SCHEMA, spent)))
    assert summarize(rows)["decode_slowest"]["name"] == "e4"
    assert summarize(rows)["value_retries_exhausted"] == 1
    assert tally([answer_line(rows[-1].entry, xgr, spent)])["value_retries_exhausted"] == 1
    line = answer_line(rows[4].entry, xgr, rows[4].answer)
    assert line["decode_ms_per_token"] == 200.0
    assert {
        k: v
        for k, v in tally([line, answer_line(rows[0].entry, xgr, rows[0].answer)]).items()
        if k.startswith("decode")
    } == {
        "decode_ms_per_token_p50": 110.0,
        "decode_slowest_over_p50": 1.82,
        "decode_slowest": {"name": "e4", "ms_per_token": 200.0, "completion_tokens": 9},
    }
    assert decode_steps(rows[3:4])["decode_ms_per_token_p50"] is None


def test_answer_lines_say_each_verdict_and_go_where_asked(tmp_path, capsys):
    llg = Check(200, engine="llguidance", strict_accepted=True)
    good = answer_line(
        Entry("s", "good", SCHEMA),
        llg,
        Answer(200, content='{"n":1}', finish_reason="length", completion_tokens=5, elapsed=0.25),
    )
    assert good == {
        "bench": "fidelity",
        "kind": "answer",
        "source": "s",
        "name": "good",
        "engine": "llguidance",
        "outcome": "valid",
        "finish_reason": "length",
        "completion_tokens": 5,
        "elapsed_s": 0.25,
    }
    closed = answer_line(
        Entry("s", "closed", SCHEMA), llg, Answer(200, content='{"n":1}', finish_reason="stop", closed_at_budget=True)
    )
    assert closed["outcome"] == "valid" and closed["closed_at_budget"] is True
    cut = answer_line(Entry("s", "cut", SCHEMA), llg, ok('{"n": 12', "length"))
    assert cut["outcome"] == "cut_off" and cut["message"]
    assert answer_line(Entry("s", "dup", SCHEMA), llg, ok('{"n": 1, "n": 1}'))["duplicate_keys"] is True
    AnswerLog()(good)  # default: stdout, among the bench's other lines
    assert json.loads(capsys.readouterr().out) == good
    path = tmp_path / "answers.jsonl"
    path.write_text(json.dumps({"earlier": "run"}) + "\n")
    log = AnswerLog(str(path))
    log(good)
    assert path.read_text().splitlines()[-1] == json.dumps(good)  # flushed at once, appended
    log(cut)
    log.close()
    assert [json.loads(line).get("name") for line in path.read_text().splitlines()] == [None, "good", "cut"]
    assert capsys.readouterr().out == ""


def test_answer_logs_tally_once_per_schema_and_say_what_a_resumed_run_skips(tmp_path):
    """A whole-corpus run done in parts: the parts' logs total each schema once (its last answer),
    and `--skip-answered` leaves out what a log holds, `--only-refused` keeps only its refusals."""
    llg = Check(200, engine="llguidance", strict_accepted=True)
    first, second = tmp_path / "part1.jsonl", tmp_path / "part2.jsonl"
    lines = [
        answer_line(Entry("a", "x", SCHEMA), llg, ok('{"n": 12', "length"), "abc1234"),  # cut, then answered again
        answer_line(
            Entry("a", "y", SCHEMA), llg, Answer(200, content='{"n":1}', finish_reason="stop", closed_at_budget=True)
        ),
    ]
    first.write_text("\n".join(json.dumps(line) for line in lines) + '\n{"kind": "answer", "sou')  # killed mid-line
    again = [
        answer_line(Entry("a", "x", SCHEMA), llg, ok('{"n": 3}')),
        answer_line(Entry("b", "z", SCHEMA), llg, Answer(400, code="context_length_exceeded", message="long")),
        {"bench": "fidelity", "kind": "source", "source": "a"},
    ]
    second.write_text("\n".join(json.dumps(line) for line in again) + "\n")
    assert answered([first, second]) == {("a", "x"), ("a", "y"), ("b", "z")}
    packed = tmp_path / "part2.jsonl.gz"
    packed.write_bytes(__import__("gzip").compress(second.read_bytes()))
    assert answered([first, packed]) == answered([first, second])
    lines = answer_lines([first, second])
    assert lines[("a", "x")]["outcome"] == "valid"  # the later answer
    a = tally([lines[("a", "x")], lines[("a", "y")]], corpus=5)
    assert (a["answered"], a["corpus"], a["valid"], a["cut_off"], a["closed_at_budget"]) == (2, 5, 2, 0, 1)
    assert lines[("a", "x")].get("commit") is None and a["commits"] == {"?": 2}  # the later answer says none
    assert json.loads(first.read_text().splitlines()[0])["commit"] == "abc1234"
    b = tally([lines[("b", "z")]])
    assert (b["refused"], b["prompt_length_refusals"], b["answered_validly_frac"]) == (1, 1, 0.0)
    assert tally([])["answered_validly_frac"] is None
    corpus = [Entry("a", n, SCHEMA) for n in "vwxyz"] + [Entry("b", "z", SCHEMA)]
    args = parse_args(False, ["--skip-answered", str(first), str(second)])
    assert [(e.source, e.name) for e in pick(corpus, ["a", "b"], args)] == [("a", "v"), ("a", "w"), ("a", "z")]
    # after a change that may take what was refused: ask those again, only
    assert refused([first, second]) == {("b", "z")}
    args = parse_args(False, ["--only-refused", str(first), str(second)])
    assert [(e.source, e.name) for e in pick(corpus, ["a", "b"], args)] == [("b", "z")]


# ------------------------------------------------------------------ against the gateway app


def test_client_side_against_the_gateway(fake_engine, gateway_grammar, tmp_path):
    from litestar.testing import AsyncTestClient

    from gateway.app import create_app
    from gateway.settings import Settings

    def schema(tag: str, **extra) -> dict:  # a description no other test compiled: a real compile
        return {
            "type": "object",
            "description": f"fidelity bench test {tag}",
            "properties": {"n": {"type": "integer", "minimum": 0}},
            "required": ["n"],
            "additionalProperties": False,
            **extra,
        }

    corpus = [
        Entry("t", "ok", schema("ok")),
        Entry("t", "dup", schema("dup")),
        Entry("t", "low", schema("low")),
        Entry("t", "unique", {"type": "array", "items": {"type": "integer", "maximum": 9}, "uniqueItems": True}),
        Entry("t", "bad", {"type": "nope"}),
    ]
    replies = {"dup": '{"n":1,"n":1}', "low": '{"n":-1}'}
    fake_engine.reply = lambda req: next(
        (text for name, text in replies.items() if f"of a {name}," in fake_engine.tokenizer.decode(req.prompt_ids)),
        '{"n":1}',
    )

    path = tmp_path / "answers.jsonl"
    log = AnswerLog(str(path))
    on_disk: list[int] = []  # lines in the file as each answer came in

    def on_answer(entry, answer):
        log(answer_line(entry, Check(200), answer))
        on_disk.append(len(path.read_text().splitlines()))

    async def drive():
        app = create_app(fake_engine, gateway_grammar, Settings(registry_dir=str(tmp_path / "registry")))
        async with AsyncTestClient(app) as client:
            return await check_all(client, corpus), await answer_all(client, corpus, 64, 2, on_answer=on_answer)

    checks, answers = asyncio.run(drive())
    log.close()
    assert on_disk == [1, 2, 3, 4, 5]  # each line is readable as soon as its answer is in
    lines = {line["name"]: line for line in map(json.loads, path.read_text().splitlines())}
    assert {name: line["outcome"] for name, line in lines.items()} == {
        "ok": "valid",
        "dup": "invalid",
        "low": "invalid",
        "unique": "refused",
        "bad": "refused",
    }
    assert [c.engine for c in checks] == ["xgrammar", "xgrammar", "xgrammar", "xgrammar", None]
    assert [c.strict_accepted for c in checks[:4]] == [True, True, True, False]
    assert checks[0].compile_ms is not None and checks[0].compile_ms > 0  # the server's own compile time
    assert checks[3].keywords == ["uniqueItems"] and checks[4].code == "invalid_schema"
    verdicts = [classify(e.schema, a, e.name) for e, a in zip(corpus, answers)]
    assert [v.outcome for v in verdicts] == ["valid", "invalid", "invalid", "refused", "refused"]
    assert [v.duplicate_keys for v in verdicts] == [False, True, False, False, False]
    assert answers[3].code == "schema_not_enforceable"
    # the server's verdict (jumpgate.schema_valid) agrees with the bench's
    assert [a.server_valid for a in answers[:3]] == [True, False, False]
    assert all(not Row(e, c, a, v).verdict_disagrees for e, c, a, v in zip(corpus, checks, answers, verdicts))


# ------------------------------------------------------------------ the memory guard, on a fake server


class FakeProc:
    def poll(self):
        return None


class FakeServer:
    """What ServerGuard uses of JumpgateServer: proc, rss_mb, start, stop, restart."""

    url = "http://fake"

    def __init__(self):
        self.proc, self.rss, self.starts, self.stops = FakeProc(), 100.0, 0, []

    def rss_mb(self):
        return self.rss

    def start(self):
        self.proc, self.rss = FakeProc(), 100.0
        self.starts += 1
        return self

    def stop(self, timeout_s=15.0):
        self.stops.append(timeout_s)
        self.proc = None

    def restart(self):
        self.stop()
        return self.start()


def wait_for(condition, timeout_s=5.0):
    import time

    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)
    return condition()


def test_guard_stops_the_server_past_its_memory_and_restarts_it_a_bounded_number_of_times():
    from bench.fidelity.client import ServerGuard

    server = FakeServer()
    with ServerGuard(server, limit_mb=1000, max_restarts=1) as guard:
        assert server.starts == 1 and guard.up
        server.rss = 5000.0
        assert wait_for(lambda: guard.kills == 1)
        assert not guard.up and server.stops == [1.0]  # SIGKILL a second after SIGTERM
        assert guard.ensure_up() and guard.up and guard.restarts == 1
        assert guard.ensure_up() and guard.restarts == 1  # up already: nothing to do
        server.rss = 5000.0
        assert wait_for(lambda: guard.kills == 2)
        assert not guard.ensure_up()  # out of restarts


def mock_client(handler):
    import httpx

    return httpx.AsyncClient(transport=httpx.MockTransport(handler), base_url="http://fake")


def test_a_check_that_takes_the_server_past_its_memory_is_its_schema_s():
    import httpx

    from bench.fidelity.client import SERVER_MEMORY, ServerGuard

    server = FakeServer()
    state = {"compile_s": 0.0}
    ok_check = {"fidelity": {"keywords": []}, "strict_accepted": True, "strict_refusal": None}

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            if server.proc is None:
                raise httpx.ConnectError("gone")
            return httpx.Response(200, text=f"jumpgate_grammar_compile_seconds_total {state['compile_s']}\n")
        if json.loads(request.content)["schema"].get("title") == "boom":  # eats memory while it is checked
            server.rss = 9999.0
            assert wait_for(lambda: server.proc is None)  # the guard stops the server mid-request
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.")
        state["compile_s"] += 0.004
        return httpx.Response(200, json=ok_check)

    corpus = [
        Entry("t", "a", {"type": "string"}),
        Entry("t", "boom", {"title": "boom"}),
        Entry("t", "b", {"type": "integer"}),
    ]

    async def go():
        async with mock_client(handler) as client:
            with ServerGuard(server, limit_mb=1000) as guard:
                return await check_all(client, corpus, guard), guard

    checks, guard = asyncio.run(go())
    assert [c.code for c in checks] == [None, SERVER_MEMORY, None]
    assert guard.kills == 1 and guard.restarts == 1 and server.starts == 2
    assert checks[0].compile_ms == pytest.approx(4.0) and checks[2].compile_ms == pytest.approx(4.0)


def test_a_request_that_lost_the_server_is_sent_once_more_and_skipped_schemas_are_not_asked():
    import httpx

    from bench.fidelity.client import NOT_ASKED, ServerGuard

    server = FakeServer()
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        if len(calls) == 1:
            server.proc = None  # the server died under this request
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.")
        return httpx.Response(
            200,
            json={
                "choices": [
                    {"message": {"content": '{"n": 1}'}, "finish_reason": "stop", "jumpgate": {"schema_valid": True}}
                ],
                "usage": {"prompt_tokens": 5, "completion_tokens": 3},
            },
        )

    corpus = [Entry("t", "a", SCHEMA), Entry("t", "skip-me", SCHEMA)]

    async def go():
        async with mock_client(handler) as client:
            with ServerGuard(server, limit_mb=1000) as guard:
                return await answer_all(client, corpus, 16, 1, guard, frozenset({("t", "skip-me")})), guard

    answers, guard = asyncio.run(go())
    assert guard.restarts == 1 and calls == ["/v1/chat/completions"] * 2
    assert answers[0].status == 200 and classify(SCHEMA, answers[0]).outcome == "valid"
    assert answers[1].code == NOT_ASKED and classify(SCHEMA, answers[1]).outcome == "error"
