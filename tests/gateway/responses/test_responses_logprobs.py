"""/v1/responses logprobs (include: ["message.output_text.logprobs"], top_logprobs) over the scripted
fake engine: what reaches the engine, the output_text shape, the streamed deltas and the refusals."""

from __future__ import annotations

import pytest

from tests.fake_engine import fake_logprobs
from tests.gateway.responses.responses_helpers import WEATHER, create, events_of

INCLUDE = ["message.output_text.logprobs"]


def expected_logprobs(tokenizer, text: str, top: int) -> list[dict]:
    """What the fake engine's records for `text` (3-character pieces) look like in the chat shape."""
    out = []
    for piece in [text[i : i + 3] for i in range(0, len(text), 3)]:
        for rec in fake_logprobs(tokenizer.encode(piece, add_special_tokens=False), top):
            tok = tokenizer.decode([rec.token_id])
            item = {
                "token": tok,
                "logprob": rec.logprob,
                "bytes": list(tok.encode()),
                "top_logprobs": [
                    {"token": tokenizer.decode([t]), "logprob": v, "bytes": list(tokenizer.decode([t]).encode())}
                    for t, v in rec.top
                ],
            }
            if rec.forced:
                item["forced"] = True
            out.append(item)
    return out


def test_include_reports_logprobs_on_the_output_text(gateway_client, fake_engine):
    client = gateway_client()
    body = create(client, include=INCLUDE, top_logprobs=2).json()
    assert client.get(f"/v1/responses/{body['id']}").json() == body  # the stored response keeps them
    [part] = body["output"][0]["content"]
    assert part["logprobs"] == expected_logprobs(fake_engine.tokenizer, "Hello there!", 2)
    assert "".join(lp["token"] for lp in part["logprobs"]) == part["text"] == "Hello there!"
    assert all(len(lp["top_logprobs"]) == 2 for lp in part["logprobs"])
    assert fake_engine.submitted[0].sampling.logprobs == 2 and body["top_logprobs"] == 2


def test_include_without_top_logprobs_gives_no_alternatives(gateway_client, fake_engine):
    body = create(gateway_client(), include=INCLUDE).json()
    logprobs = body["output"][0]["content"][0]["logprobs"]
    assert logprobs and all(lp["top_logprobs"] == [] for lp in logprobs)
    assert fake_engine.submitted[0].sampling.logprobs == 0


def test_top_logprobs_without_the_include_reports_none(gateway_client, fake_engine):
    """As OpenAI does: `top_logprobs` alone leaves `logprobs` empty (and costs the engine nothing)."""
    body = create(gateway_client(), top_logprobs=3).json()
    assert body["output"][0]["content"][0]["logprobs"] == []
    assert fake_engine.submitted[0].sampling.logprobs is None


def test_streamed_delta_logprobs_add_up_to_the_whole_response(gateway_client, fake_engine):
    client = gateway_client()
    whole = create(client, include=INCLUDE, top_logprobs=1).json()["output"][0]["content"][0]["logprobs"]
    events = events_of(create(client, include=INCLUDE, top_logprobs=1, stream=True))
    deltas = [e for t, e in events if t == "response.output_text.delta"]
    assert all(e["logprobs"] for e in deltas)  # every delta carries the tokens behind it
    assert [lp for e in deltas for lp in e["logprobs"]] == whole
    [done] = [e for t, e in events if t == "response.output_text.done"]
    [part_done] = [e for t, e in events if t == "response.content_part.done"]
    final = events[-1][1]["response"]["output"][0]["content"][0]
    assert done["logprobs"] == part_done["part"]["logprobs"] == final["logprobs"] == whole


def test_stream_without_the_include_has_empty_logprobs(gateway_client, fake_engine):
    events = events_of(create(gateway_client(), stream=True))
    assert all(e["logprobs"] == [] for t, e in events if t.startswith("response.output_text."))
    assert fake_engine.submitted[0].sampling.logprobs is None


@pytest.mark.parametrize(
    "body, param",
    [
        ({"top_logprobs": 21}, "top_logprobs"),
        ({"top_logprobs": -1, "include": INCLUDE}, "top_logprobs"),
        ({"include": INCLUDE + ["reasoning.encrypted_content"]}, "include"),
        ({"include": INCLUDE, "tools": [WEATHER]}, "include"),
    ],
)
def test_bad_logprob_options_name_the_param(gateway_client, fake_engine, body, param):
    resp = create(gateway_client(), **body)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error" and error["message"]
    assert not fake_engine.submitted
