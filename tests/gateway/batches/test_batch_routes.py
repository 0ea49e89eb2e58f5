"""The Files and Batches routes over create_app with the scripted engine (tests/fake_engine.py):
uploads, a batch run to its output file through the online route, bad inputs in OpenAI's error
shape, cancel, and the background priority of the lines' engine requests."""

from __future__ import annotations

import json
import time

import pytest

from runtime.api import BACKGROUND_PRIORITY

MODEL = "SmolLM2-135M-Instruct"


def jsonl(lines: list[dict]) -> bytes:
    return b"".join(json.dumps(x).encode() + b"\n" for x in lines)


def chat_line(i: int, content: str = "Hi") -> dict:
    return {
        "custom_id": f"req-{i}",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": MODEL, "messages": [{"role": "user", "content": f"{content} {i}"}], "max_tokens": 8},
    }


def upload(client, data: bytes, purpose: str = "batch", name: str = "in.jsonl"):
    return client.post("/v1/files", files={"file": (name, data, "application/jsonl")}, data={"purpose": purpose})


def wait_final(client, batch_id: str, timeout_s: float = 20.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        batch = client.get(f"/v1/batches/{batch_id}").json()
        if batch["status"] in ("completed", "failed", "cancelled", "expired"):
            return batch
        time.sleep(0.05)
    raise AssertionError(f"batch {batch_id} did not finish: {batch}")


def assert_error(resp, status: int, param: str | None = None, code: str | None = None) -> dict:
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if param is not None:
        assert error["param"] == param
    if code is not None:
        assert error["code"] == code
    return error


@pytest.fixture
def client(gateway_client):
    return gateway_client(batch_file_max_bytes=4096)


def test_a_batch_runs_to_its_output_file_at_background_priority(client, fake_engine):
    f = upload(
        client,
        jsonl(
            [chat_line(i) for i in range(5)]
            + [
                {
                    "custom_id": "bad-model",
                    "method": "POST",
                    "url": "/v1/chat/completions",
                    "body": {"model": "nope", "messages": [{"role": "user", "content": "x"}]},
                }
            ]
        ),
    )
    assert f.status_code == 200, f.text
    assert f.json()["purpose"] == "batch" and f.json()["object"] == "file" and f.json()["bytes"] > 0
    created = client.post(
        "/v1/batches",
        json={
            "input_file_id": f.json()["id"],
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
            "metadata": {"k": "v"},
        },
    )
    assert created.status_code == 200, created.text
    assert created.json()["status"] == "validating" and created.json()["metadata"] == {"k": "v"}
    batch = wait_final(client, created.json()["id"])
    assert batch["status"] == "completed"
    assert batch["request_counts"] == {"total": 6, "completed": 5, "failed": 1}
    out = [json.loads(x) for x in client.get(f"/v1/files/{batch['output_file_id']}/content").content.splitlines()]
    assert sorted(x["custom_id"] for x in out) == [f"req-{i}" for i in range(5)]
    for line in out:
        assert line["error"] is None and line["response"]["status_code"] == 200
        body = line["response"]["body"]
        assert body["object"] == "chat.completion" and body["choices"][0]["message"]["content"] == "Hello there!"
        assert line["response"]["request_id"] == body["id"]
    [err] = [json.loads(x) for x in client.get(f"/v1/files/{batch['error_file_id']}/content").content.splitlines()]
    assert err["custom_id"] == "bad-model" and err["response"]["status_code"] == 404
    assert err["response"]["body"]["error"]["param"] == "model"
    assert {r.priority for r in fake_engine.submitted} == {BACKGROUND_PRIORITY}
    files = client.get("/v1/files").json()
    assert {x["purpose"] for x in files["data"]} == {"batch", "batch_output"} and len(files["data"]) == 3
    assert [b["id"] for b in client.get("/v1/batches").json()["data"]] == [batch["id"]]
    metrics = client.get("/metrics").text
    assert 'jumpgate_batch_requests_total{status="completed"} 5.0' in metrics
    assert 'jumpgate_batches{status="completed"} 1.0' in metrics


def test_online_requests_keep_priority_zero(client, fake_engine):
    r = client.post("/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 200 and fake_engine.submitted[-1].priority == 0


def test_a_file_with_bad_lines_fails_the_batch_listing_each_line(client):
    data = (
        json.dumps(chat_line(0))
        + "\nnot json\n"
        + json.dumps(chat_line(0))
        + "\n"
        + json.dumps({**chat_line(3), "url": "/v1/completions"})
        + "\n"
    ).encode()
    f = upload(client, data).json()
    created = client.post(
        "/v1/batches", json={"input_file_id": f["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    ).json()
    batch = wait_final(client, created["id"])
    assert batch["status"] == "failed" and batch["output_file_id"] is None
    errors = {(e["line"], e["code"]) for e in batch["errors"]["data"]}
    assert errors == {(2, "invalid_json_line"), (3, "duplicate_custom_id"), (4, "mismatched_url")}


def test_bad_inputs_get_the_api_error_shape(client):
    assert_error(upload(client, b"x" * 5000), 413, "file", "file_too_large")
    assert_error(upload(client, jsonl([chat_line(0)]), purpose="fine-tune"), 400, "purpose", "invalid_purpose")
    assert_error(upload(client, b""), 400, "file")
    assert_error(client.post("/v1/files", data={"purpose": "batch"}), 400)
    assert_error(client.get("/v1/files/file-" + "0" * 32), 404, "file_id", "file_not_found")
    assert_error(client.get("/v1/files/nope/content"), 404)
    assert_error(client.delete("/v1/files/file-" + "1" * 32), 404)
    f = upload(client, jsonl([chat_line(0)])).json()
    body = {"input_file_id": f["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    assert_error(
        client.post("/v1/batches", json={**body, "endpoint": "/v1/embeddings"}), 400, "endpoint", "invalid_endpoint"
    )
    assert_error(client.post("/v1/batches", json={**body, "completion_window": "1h"}), 400, "completion_window")
    assert_error(
        client.post("/v1/batches", json={**body, "input_file_id": "file-" + "2" * 32}),
        404,
        "input_file_id",
        "file_not_found",
    )
    assert_error(client.post("/v1/batches", json={"endpoint": "/v1/completions"}), 400)
    assert_error(client.post("/v1/batches", content=b"{not json", headers={"content-type": "application/json"}), 400)
    assert_error(client.get("/v1/batches/batch_nope"), 404, "batch_id", "batch_not_found")
    assert_error(client.post("/v1/batches/batch_nope/cancel"), 404, "batch_id")
    assert_error(client.get("/v1/batches?limit=0"), 400, "limit")
    done = wait_final(client, client.post("/v1/batches", json=body).json()["id"])
    assert done["status"] == "completed"
    assert_error(client.post(f"/v1/batches/{done['id']}/cancel"), 409, "batch_id", "batch_not_cancellable")
    out = client.get(f"/v1/files/{done['output_file_id']}").json()
    assert out["purpose"] == "batch_output"
    assert_error(
        client.post("/v1/batches", json={**body, "input_file_id": out["id"]}),
        400,
        "input_file_id",
        "invalid_file_purpose",
    )
    assert client.delete(f"/v1/files/{f['id']}").json() == {"id": f["id"], "object": "file", "deleted": True}
    assert_error(client.get(f"/v1/files/{f['id']}/content"), 404)


def test_cancel_stops_a_running_batch_and_aborts_its_lines(gateway_client, fake_engine):
    client = gateway_client(batch_concurrency=2)
    fake_engine.reply = lambda req: "x" * 300
    fake_engine.delay = 0.02  # 100 events: ~2 s a line
    f = upload(client, jsonl([chat_line(i) for i in range(6)])).json()
    created = client.post(
        "/v1/batches", json={"input_file_id": f["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    ).json()
    deadline = time.monotonic() + 10
    while client.get(f"/v1/batches/{created['id']}").json()["status"] != "in_progress" and time.monotonic() < deadline:
        time.sleep(0.02)
    while len(fake_engine.submitted) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    cancelling = client.post(f"/v1/batches/{created['id']}/cancel").json()
    assert cancelling["status"] == "cancelling" and cancelling["cancelling_at"]
    batch = wait_final(client, created["id"])
    assert batch["status"] == "cancelled" and batch["cancelled_at"]
    assert batch["request_counts"]["completed"] + batch["request_counts"]["failed"] < 6
    assert len(fake_engine.submitted) == 2 and {r.rid for r in fake_engine.submitted} <= set(fake_engine.aborted)


def test_tenants_see_only_their_own_files_and_batches(gateway_client):
    client = gateway_client(api_keys=["key-a", "key-b"])
    a, b = {"Authorization": "Bearer key-a"}, {"Authorization": "Bearer key-b"}
    f = client.post(
        "/v1/files",
        files={"file": ("in.jsonl", jsonl([chat_line(0)]), "application/jsonl")},
        data={"purpose": "batch"},
        headers=a,
    ).json()
    assert client.get(f"/v1/files/{f['id']}", headers=a).status_code == 200
    assert_error(client.get(f"/v1/files/{f['id']}", headers=b), 404)
    assert client.get("/v1/files", headers=b).json()["data"] == []
    assert_error(client.get("/v1/files"), 401)
    body = {"input_file_id": f["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    assert_error(client.post("/v1/batches", json=body, headers=b), 404, "input_file_id")
    created = client.post("/v1/batches", json=body, headers=a).json()
    assert_error(client.get(f"/v1/batches/{created['id']}", headers=b), 404)


def test_text_completion_lines_answer_like_the_online_route(client):
    lines = [
        {
            "custom_id": f"t{i}",
            "method": "POST",
            "url": "/v1/completions",
            "body": {"model": MODEL, "prompt": f"Shared header\nrow {i}", "max_tokens": 4},
        }
        for i in range(3)
    ]
    f = upload(client, jsonl(lines)).json()
    batch = wait_final(
        client,
        client.post(
            "/v1/batches", json={"input_file_id": f["id"], "endpoint": "/v1/completions", "completion_window": "24h"}
        ).json()["id"],
    )
    assert batch["status"] == "completed" and batch["request_counts"]["completed"] == 3
    out = [json.loads(x) for x in client.get(f"/v1/files/{batch['output_file_id']}/content").content.splitlines()]
    online = client.post("/v1/completions", json=lines[0]["body"]).json()
    first = next(x["response"]["body"] for x in out if x["custom_id"] == "t0")
    assert first["object"] == online["object"] == "text_completion"
    assert first["choices"] == online["choices"] and first["usage"] == online["usage"]
