"""The Batch API's pieces alone: the file and batch stores on disk, the input file's checks, the
prefix-grouped run order, and recovering answered lines from a torn output file."""

from __future__ import annotations

import io
import json

import pytest

from gateway.batches.files import FileStore
from gateway.batches.lines import BatchLine, parse_lines, run_order
from gateway.batches.objects import BatchObject
from gateway.batches.runner import recover_answered, result_line
from gateway.batches.store import BatchStore, InvalidTransition, new_batch_id

EP = "/v1/chat/completions"


def line(i: int, system: str, user: str, index: int | None = None) -> BatchLine:
    return BatchLine(
        index=i if index is None else index,
        custom_id=f"c{i}",
        url=EP,
        body={"model": "m", "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}]},
    )


def test_file_store_is_per_tenant_and_survives_a_reopen(tmp_path):
    files = FileStore(tmp_path)
    f = files.create("tA", io.BytesIO(b'{"a":1}\n'), "in.jsonl", "batch")
    assert f.bytes == 8 and f.id.startswith("file-")
    assert files.get("tB", f.id) is None and files.list("tB") == []
    again = FileStore(tmp_path)
    assert again.get("tA", f.id) == f and again.content_path("tA", f.id).read_bytes() == b'{"a":1}\n'
    assert again.list("tA", purpose="batch_output") == []
    with pytest.raises(ValueError):
        files.content_path("tA", "../etc/passwd")
    assert files.get("tA", "../x") is None
    assert files.delete("tA", f.id) and not files.delete("tA", f.id) and files.get("tA", f.id) is None


def test_an_output_file_is_invisible_until_finished(tmp_path):
    files = FileStore(tmp_path)
    fid = "file-" + "a" * 32
    path = files.content_path("", fid)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"x\n")
    assert files.get("", fid) is None
    assert files.finish("", fid, "out.jsonl", "batch_output").bytes == 2 and files.get("", fid) is not None


def test_batch_store_state_machine_persists_each_change(tmp_path):
    store = BatchStore(tmp_path)
    b = BatchObject(
        id=new_batch_id(),
        endpoint=EP,
        input_file_id="file-x",
        completion_window="24h",
        status="validating",
        created_at=1,
        expires_at=2,
    )
    store.add("tA", b)
    store.transition("tA", b, "in_progress")
    b.request_counts.completed = 3
    store.save("tA", b)
    with pytest.raises(InvalidTransition):
        store.transition("tA", b, "completed")  # finalizing comes first
    reopened = BatchStore(tmp_path)
    got = reopened.get("tA", b.id)
    assert got.status == "in_progress" and got.in_progress_at and got.request_counts.completed == 3
    assert reopened.get("tB", b.id) is None and [s.batch.id for s in reopened.unfinished()] == [b.id]
    reopened.transition("tA", got, "cancelling")
    reopened.transition("tA", got, "cancelled")
    assert BatchStore(tmp_path).unfinished() == []


def test_parse_lines_lists_every_bad_line():
    good = {"custom_id": "a", "method": "POST", "url": EP, "body": {"model": "m"}}
    data = "\n".join(
        [
            json.dumps(good),
            "{oops",
            json.dumps([1]),
            json.dumps({**good, "custom_id": ""}),
            json.dumps(good),
            json.dumps({**good, "custom_id": "b", "method": "GET"}),
            json.dumps({**good, "custom_id": "c", "body": 3}),
            "",
            json.dumps({**good, "custom_id": "d"}),
        ]
    ).encode()
    lines, errors = parse_lines(data, EP, 100)
    assert [x.custom_id for x in lines] == ["a", "d"] and lines[1].index == 8
    assert [(e.line, e.code) for e in errors] == [
        (2, "invalid_json_line"),
        (3, "invalid_request"),
        (4, "missing_required_parameter"),
        (5, "duplicate_custom_id"),
        (6, "invalid_method"),
        (7, "invalid_request"),
    ]
    assert parse_lines(b"\n\n", EP, 100)[1][0].code == "empty_file"
    assert parse_lines(data, EP, 1)[1][-1].code == "too_many_requests"


def test_run_order_groups_shared_prefixes_longest_saving_first():
    long_sys, short_sys = "L" * 500, "S" * 50
    lines = [
        line(0, short_sys, "q2"),
        line(1, long_sys, "b"),
        line(2, "alone", "x"),
        line(3, short_sys, "q1"),
        line(4, long_sys, "a"),
        line(5, long_sys, "c"),
    ]
    order = [x.custom_id for x in run_order(lines)]
    # the long system prompt's three lines first (each sorted by the rest), then the short one's two
    assert order == ["c4", "c1", "c5", "c3", "c0", "c2"]


def test_run_order_of_text_completions_groups_by_the_prompt_head():
    def text(i, prompt):
        return BatchLine(index=i, custom_id=f"t{i}", url="/v1/completions", body={"model": "m", "prompt": prompt})

    lines = [
        text(0, "Schema A\nrow 2"),
        text(1, "Schema B\nrow 1"),
        text(2, "Schema A\nrow 1"),
        text(3, "Schema B\nrow 0"),
    ]
    assert [x.custom_id for x in run_order(lines)] == ["t2", "t0", "t3", "t1"]


def test_recover_answered_cuts_a_torn_last_line(tmp_path):
    out = tmp_path / "out.jsonl"
    ok = result_line(line(0, "s", "u"), 200, b'{"id":"chatcmpl-1"}')
    second = result_line(line(1, "s", "u"), 200, b'{"id":"chatcmpl-2"}')
    out.write_bytes(ok + second[:20])  # killed while writing the second line
    assert recover_answered(out) == {"c0"}
    assert out.read_bytes() == ok
    assert json.loads(ok)["response"] == {"status_code": 200, "request_id": "chatcmpl-1", "body": {"id": "chatcmpl-1"}}
    assert recover_answered(tmp_path / "missing.jsonl") == set()


class ScriptedCaller:
    """Answers lines in order; raises on the custom_ids in `fail`, like a bug under the route."""

    def __init__(self, fail=()):
        self.fail, self.calls = set(fail), []

    async def post(self, path, body, tenant, priority=1):
        content = json.loads(body)["messages"][-1]["content"]
        self.calls.append(content)
        if content in self.fail:
            raise RuntimeError("boom")
        return 200, json.dumps({"id": "chatcmpl-" + content, "object": "chat.completion"}).encode()


def run_batch(tmp_path, caller, lines):
    import asyncio
    import time

    from gateway.batches.runner import BatchRunner

    files, store = FileStore(tmp_path / "files"), BatchStore(tmp_path / "batches")
    f = files.create("", io.BytesIO(b"".join(json.dumps(x).encode() + b"\n" for x in lines)), "in.jsonl", "batch")
    b = BatchObject(
        id=new_batch_id(),
        endpoint=EP,
        input_file_id=f.id,
        completion_window="24h",
        status="validating",
        created_at=int(time.time()),
        expires_at=int(time.time()) + 60,
    )
    store.add("", b)

    async def go():
        runner = BatchRunner(store, files, caller, None, concurrency=2, max_requests=100)
        runner.start()
        for _ in range(200):
            if b.status == "completed":
                break
            await asyncio.sleep(0.02)
        await runner.stop()

    asyncio.run(go())
    return files, b


def test_the_runner_answers_in_prefix_order_and_keeps_a_raising_line(tmp_path):
    lines = [
        {
            "custom_id": f"c{i}",
            "method": "POST",
            "url": EP,
            "body": {
                "model": "m",
                "messages": [{"role": "system", "content": "AB"[i % 2] * 300}, {"role": "user", "content": f"u{i}"}],
            },
        }
        for i in range(6)
    ]
    caller = ScriptedCaller(fail={"u3"})
    files, b = run_batch(tmp_path, caller, lines)
    assert b.status == "completed" and (b.request_counts.completed, b.request_counts.failed) == (5, 1)
    assert caller.calls == ["u0", "u2", "u4", "u1", "u3", "u5"]  # each prefix's lines together
    out = files.content_path("", b.output_file_id).read_bytes().splitlines()
    [err] = files.content_path("", b.error_file_id).read_bytes().splitlines()
    assert len(out) == 5 and json.loads(err)["custom_id"] == "c3"
    assert json.loads(err)["response"]["status_code"] == 500
