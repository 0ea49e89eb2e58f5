"""The Batch API end to end: the official `openai` client against a real `jumpgate serve` (SmolLM2
on CPU) of this module's own, which the last test kills (SIGKILL) mid-batch and restarts on the
same data folder: the batch resumes and its output holds each custom_id exactly once."""

from __future__ import annotations

import io
import json
import os
import signal
import time

import openai
import pytest

from bench.harness.server_process import MODEL, JumpgateServer
from tests.conftest import openai_client

pytestmark = pytest.mark.e2e

SYSTEM = "You extract facts from a sentence about a city and answer with JSON only. Keep names as written. " * 6
CITY = {
    "type": "json_schema",
    "json_schema": {
        "name": "city",
        "strict": True,
        "schema": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
FILE_LIMIT = 64 * 1024


def chat_body(sentence: str, max_tokens: int = 12, structured: bool = True) -> dict:
    body = {
        "model": MODEL,
        "temperature": 0,
        "max_tokens": max_tokens,
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": sentence}],
    }
    return {**body, "response_format": CITY} if structured else body


def jsonl(lines: list[dict]) -> io.BytesIO:
    return io.BytesIO(b"".join(json.dumps(x).encode() + b"\n" for x in lines))


def chat_lines(n: int, prefix: str = "c", max_tokens: int = 12, structured: bool = True) -> list[dict]:
    towns = ["Paris", "Lima", "Oslo", "Cairo", "Rome", "Quito", "Accra", "Hanoi", "Riga", "Bern", "Doha", "Sofia"]
    return [
        {
            "custom_id": f"{prefix}{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": chat_body(f"I flew to {towns[i % len(towns)]} in spring {2000 + i}.", max_tokens, structured),
        }
        for i in range(n)
    ]


def wait_batch(client: openai.OpenAI, batch_id: str, timeout_s: float = 120.0, until=None):
    deadline = time.monotonic() + timeout_s
    while True:
        batch = client.batches.retrieve(batch_id)
        if until(batch) if until else batch.status in ("completed", "failed", "cancelled", "expired"):
            return batch
        assert time.monotonic() < deadline, f"batch {batch_id} stuck: {batch}"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = JumpgateServer(
        tmp_path_factory.mktemp("jumpgate-batches"),
        kv_pool_tokens=16384,
        extra_args=["--batch-file-max-bytes", str(FILE_LIMIT), "--batch-concurrency", "4"],
    )
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai_client(server)


def test_files_and_batches_through_the_official_client(client):
    lines = chat_lines(6)
    f = client.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
    assert f.purpose == "batch" and f.bytes > 0 and client.files.retrieve(f.id).id == f.id
    batch = client.batches.create(
        input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h", metadata={"job": "e2e"}
    )
    assert batch.status == "validating" and batch.metadata == {"job": "e2e"}
    batch = wait_batch(client, batch.id)
    assert batch.status == "completed", batch
    assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (6, 6, 0)
    assert batch.error_file_id is None and batch.completed_at >= batch.in_progress_at >= batch.created_at
    out = [json.loads(x) for x in client.files.content(batch.output_file_id).text.splitlines()]
    assert sorted(x["custom_id"] for x in out) == sorted(x["custom_id"] for x in lines)
    cached = 0
    for line in out:
        body = line["response"]["body"]
        assert line["response"]["status_code"] == 200 and line["error"] is None
        assert body["object"] == "chat.completion" and line["response"]["request_id"] == body["id"]
        cached += body["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached > 0  # the lines share the system prompt: all but the first hit the cache
    # the same request online gives the same answer (temperature 0; the CPU kernels are batch-invariant)
    first = next(x for x in out if x["custom_id"] == "c0")
    online = client.chat.completions.create(**lines[0]["body"])
    assert online.choices[0].message.content == first["response"]["body"]["choices"][0]["message"]["content"]
    assert batch.id in [b.id for b in client.batches.list()]
    assert client.files.retrieve(batch.output_file_id).purpose == "batch_output"
    with pytest.raises(openai.ConflictError):
        client.batches.cancel(batch.id)


def test_bad_inputs_are_openai_errors(client, server):
    with pytest.raises(openai.BadRequestError) as e:
        client.files.create(file=("in.jsonl", jsonl(chat_lines(1))), purpose="fine-tune")
    assert e.value.body["param"] == "purpose"
    with pytest.raises(openai.APIStatusError) as e:
        client.files.create(file=("big.jsonl", io.BytesIO(b"x" * (FILE_LIMIT + 1))), purpose="batch")
    assert e.value.status_code == 413 and e.value.body["code"] == "file_too_large"
    with pytest.raises(openai.NotFoundError):
        client.files.content("file-" + "0" * 32)
    with pytest.raises(openai.NotFoundError):
        client.batches.create(
            input_file_id="file-" + "0" * 32, endpoint="/v1/chat/completions", completion_window="24h"
        )
    f = client.files.create(
        file=("in.jsonl", io.BytesIO(b'{"custom_id": "a", "method": "POST"\nnot json\n')), purpose="batch"
    )
    with pytest.raises(openai.BadRequestError) as e:
        client.batches.create(input_file_id=f.id, endpoint="/v1/embeddings", completion_window="24h")
    assert e.value.body["param"] == "endpoint"
    failed = wait_batch(
        client, client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h").id
    )
    assert failed.status == "failed" and {(x.line, x.code) for x in failed.errors.data} == {
        (1, "invalid_json_line"),
        (2, "invalid_json_line"),
    }
    with pytest.raises(openai.NotFoundError):
        client.batches.retrieve("batch_missing")
    # a line the online route refuses is answered in the error file with that route's error
    bad = chat_lines(2, prefix="b")
    bad[1]["body"]["max_tokens"] = -1
    done = wait_batch(
        client,
        client.batches.create(
            input_file_id=client.files.create(file=("in.jsonl", jsonl(bad)), purpose="batch").id,
            endpoint="/v1/chat/completions",
            completion_window="24h",
        ).id,
    )
    assert (done.request_counts.completed, done.request_counts.failed) == (1, 1)
    [err] = [json.loads(x) for x in client.files.content(done.error_file_id).text.splitlines()]
    assert err["custom_id"] == "b1" and err["response"]["status_code"] == 400
    assert set(err["response"]["body"]["error"]) == {"message", "type", "param", "code"}
    assert server.metrics().get('jumpgate_batch_requests_total{status="failed"}', 0) >= 1


def test_cancel_a_running_batch(client, server):
    f = client.files.create(
        file=("in.jsonl", jsonl(chat_lines(40, prefix="x", max_tokens=16, structured=False))), purpose="batch"
    )
    batch = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    wait_batch(client, batch.id, until=lambda b: b.status == "in_progress")
    assert client.batches.cancel(batch.id).status in ("cancelling", "cancelled")
    done = wait_batch(client, batch.id)
    assert done.status == "cancelled" and done.request_counts.completed < 40
    server.wait_metrics(timeout_s=30)  # every engine request of the batch ended: nothing stuck
    assert server.metrics().get('jumpgate_batches{status="cancelled"}') == 1


def test_a_killed_server_resumes_the_batch_and_answers_each_line_once(client, server):
    lines = chat_lines(8, prefix="r", max_tokens=8, structured=False)
    f = client.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
    batch = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    wait_batch(client, batch.id, until=lambda b: b.request_counts.completed >= 2)
    os.kill(server.pid, signal.SIGKILL)  # mid-batch: lines in flight, a line maybe half written
    server.proc.wait(timeout=30)
    server.proc = None
    server.start()  # same data folder
    done = wait_batch(client, batch.id, timeout_s=180)
    assert done.status == "completed" and done.request_counts.completed == 8, done
    ids = [json.loads(x)["custom_id"] for x in client.files.content(done.output_file_id).text.splitlines()]
    assert sorted(ids) == sorted(x["custom_id"] for x in lines)  # each exactly once
