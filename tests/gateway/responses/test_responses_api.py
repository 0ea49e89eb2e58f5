"""/v1/responses without model compute: the scripted fake engine behind the real app, the response
store on its own, the input-item conversion, and the exact-prefix rendering of a chained turn with
the real SmolLM2 tokenizer and chat template."""

from __future__ import annotations

import json

import msgspec
import pytest

from gateway.errors import APIError
from gateway.pipeline.prompt import PromptRenderer
from gateway.protocol import AssistantMessage, ToolMessage, UserMessage
from gateway.responses.items import input_messages
from gateway.responses.protocol import OutputMessage, OutputText, ResponseObject
from gateway.responses.store import ResponseStore, StoredResponse, StoredTurn, new_response_id
from tests.conftest import OTHER_TOKEN

MODEL = "SmolLM2-135M-Instruct"
CALL_TEXT = '<tool_call>{"name":"get_weather","arguments":{"city":"Paris"}}</tool_call>'
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
CITY_FORMAT = {
    "type": "json_schema",
    "name": "city",
    "strict": True,
    "schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
}


def create(client, **body):
    body.setdefault("model", MODEL)
    body.setdefault("input", "hi")
    return client.post("/v1/responses", json=body)


def events_of(resp) -> list[tuple[str, dict]]:
    assert resp.headers["content-type"].startswith("text/event-stream")
    out = []
    for block in resp.text.split("\n\n"):
        if block.strip():
            head, _, data = block.partition("\ndata: ")
            assert head.startswith("event: "), block
            body = json.loads(data)
            assert body["type"] == head[len("event: ") :]
            out.append((body["type"], body))
    return out


# ------------------------------------------------------------------ HTTP over the fake engine


def test_response_shape_and_usage(gateway_client, fake_engine):
    resp = create(
        gateway_client(), instructions="Be brief.", max_output_tokens=20, temperature=0, seed=3, metadata={"k": "v"}
    )
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["object"] == "response" and body["id"].startswith("resp_") and body["status"] == "completed"
    assert body["output"][0]["type"] == "message" and body["output"][0]["role"] == "assistant"
    assert body["output"][0]["content"] == [
        {"type": "output_text", "text": "Hello there!", "annotations": [], "logprobs": []}
    ]
    assert body["metadata"] == {"k": "v"} and body["instructions"] == "Be brief."
    req = fake_engine.submitted[0]
    assert body["usage"] == {
        "input_tokens": len(req.prompt_ids),
        "output_tokens": 4,
        "total_tokens": len(req.prompt_ids) + 4,
        "input_tokens_details": {"cached_tokens": 3},
        "output_tokens_details": {"reasoning_tokens": 0},
    }
    assert req.sampling.max_new_tokens == 20 and req.sampling.seed == 3
    assert "Be brief." in fake_engine.tokenizer.decode(req.prompt_ids)


def test_empty_tools_list_means_no_tools(gateway_client, fake_engine):
    """The Agents SDK sends `tools: []` for an agent without tools (chat would refuse an empty list)."""
    resp = create(gateway_client(), tools=[])
    assert resp.status_code == 200, resp.text
    assert fake_engine.submitted[0].constraint is None


def test_max_output_tokens_gives_incomplete(gateway_client, fake_engine):
    fake_engine.finish_reason = "length"
    body = create(gateway_client()).json()
    assert body["status"] == "incomplete" and body["incomplete_details"] == {"reason": "max_output_tokens"}


def test_store_retrieve_delete_and_tenants(gateway_client):
    client = gateway_client(api_keys=["alice", "bob"])
    alice, bob = {"Authorization": "Bearer alice"}, {"Authorization": "Bearer bob"}
    created = client.post("/v1/responses", json={"model": MODEL, "input": "hi"}, headers=alice).json()
    rid = created["id"]
    assert client.get(f"/v1/responses/{rid}", headers=alice).json() == created
    other = client.get(f"/v1/responses/{rid}", headers=bob)
    assert other.status_code == 404 and other.json()["error"]["code"] == "response_not_found"
    chained = client.post(
        "/v1/responses", json={"model": MODEL, "input": "more", "previous_response_id": rid}, headers=bob
    )
    assert chained.status_code == 404 and chained.json()["error"]["param"] == "previous_response_id"
    assert client.delete(f"/v1/responses/{rid}", headers=bob).status_code == 404
    assert client.delete(f"/v1/responses/{rid}", headers=alice).json() == {
        "id": rid,
        "deleted": True,
        "object": "response.deleted",
    }
    assert client.get(f"/v1/responses/{rid}", headers=alice).status_code == 404


def test_store_false_is_not_kept(gateway_client):
    client = gateway_client()
    rid = create(client, store=False).json()["id"]
    assert client.get(f"/v1/responses/{rid}").status_code == 404


def test_previous_response_prompt_extends_the_stored_ids(gateway_client, fake_engine):
    client = gateway_client()
    first = create(client, input="My name is Ada.", instructions="Be brief.").json()
    create(client, input="What is my name?", instructions="Be brief.", previous_response_id=first["id"])
    one, two = fake_engine.submitted
    assert two.prompt_ids[: len(one.prompt_ids)] == one.prompt_ids
    text = fake_engine.tokenizer.decode(two.prompt_ids)
    assert "My name is Ada." in text and "Hello there!" in text and text.count("Be brief.") == 1


def test_function_call_output_and_tool_call_items(gateway_client, fake_engine):
    fake_engine.reply = lambda req: CALL_TEXT
    client = gateway_client()
    body = create(client, input="Weather in Paris?", tools=[WEATHER], tool_choice="required").json()
    [call] = body["output"]
    assert call["type"] == "function_call" and call["name"] == "get_weather"
    assert json.loads(call["arguments"]) == {"city": "Paris"} and call["call_id"].startswith("call_")
    fake_engine.reply = lambda req: "Sunny."
    follow = create(
        client,
        tools=[WEATHER],
        previous_response_id=body["id"],
        input=[{"type": "function_call_output", "call_id": call["call_id"], "output": "sunny, 21C"}],
    )
    assert follow.status_code == 200, follow.text
    assert "sunny, 21C" in fake_engine.tokenizer.decode(fake_engine.submitted[-1].prompt_ids)


def test_tools_with_a_format_answer_as_a_message(gateway_client, fake_engine):
    """Agents SDK shape: function tools plus a JSON schema; the final answer is a message."""
    fake_engine.reply = lambda req: '<tool_call>{"name":"final_answer","arguments":{"city":"Paris"}}</tool_call>'
    body = create(gateway_client(), tools=[WEATHER], text={"format": CITY_FORMAT}).json()
    [message] = body["output"]
    assert message["type"] == "message" and json.loads(message["content"][0]["text"]) == {"city": "Paris"}
    prompt = fake_engine.tokenizer.decode(fake_engine.submitted[0].prompt_ids)
    assert "final_answer" in prompt and "get_weather" in prompt


def test_stream_events(gateway_client):
    resp = create(gateway_client(), stream=True)
    events = events_of(resp)
    types = [t for t, _ in events]
    assert types[:5] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
    ]
    assert types[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e["sequence_number"] for _, e in events] == list(range(len(events)))
    deltas = "".join(e["delta"] for t, e in events if t == "response.output_text.delta")
    final = events[-1][1]["response"]
    assert deltas == "Hello there!" == final["output"][0]["content"][0]["text"]
    assert final["status"] == "completed" and final["usage"]["output_tokens"] == 4


def test_stream_tool_call_events(gateway_client, fake_engine):
    fake_engine.reply = lambda req: CALL_TEXT
    events = events_of(create(gateway_client(), stream=True, tools=[WEATHER], tool_choice="required"))
    types = [t for t, _ in events]
    assert "response.output_text.delta" not in types
    args = "".join(e["delta"] for t, e in events if t == "response.function_call_arguments.delta")
    [done] = [e for t, e in events if t == "response.function_call_arguments.done"]
    assert args == done["arguments"] and json.loads(args) == {"city": "Paris"} and done["name"] == "get_weather"
    [call] = events[-1][1]["response"]["output"]
    assert call["type"] == "function_call" and call["arguments"] == args


def test_engine_failure_in_stream_is_response_failed(gateway_client, fake_engine):
    fake_engine.finish_reason = "error"
    events = events_of(create(gateway_client(), stream=True))
    kind, last = events[-1]
    assert kind == "response.failed" and last["response"]["status"] == "failed"
    assert last["response"]["error"]["code"] == "engine_error"


@pytest.mark.parametrize(
    "field, value, param",
    [
        ("tools", [{"type": "web_search"}], "tools[0].type"),
        ("tools", [{"type": "file_search", "name": "x"}], "tools[0].type"),
        ("reasoning", {"effort": "high"}, "reasoning"),
        ("background", True, "background"),
        ("include", ["file_search_call.results"], "include"),
        ("conversation", "conv_1", "conversation"),
        ("truncation", "auto", "truncation"),
        ("max_output_tokens", 0, "max_output_tokens"),
        (
            "input",
            [{"type": "message", "role": "user", "content": [{"type": "input_image", "image_url": "x"}]}],
            "input[0].content[0].type",
        ),
        ("input", [{"type": "computer_call_output", "call_id": "c"}], "input[0].type"),
        ("input", [{"type": "function_call", "name": "f"}], "input[0].call_id"),
        ("input", [], "input"),
    ],
)
def test_unsupported_and_bad_fields_name_the_param(gateway_client, field, value, param):
    resp = create(gateway_client(), **{field: value})
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error" and error["message"]


def test_chat_errors_use_responses_names(gateway_client):
    resp = create(gateway_client(max_tokens_limit=10), max_output_tokens=50)
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "max_output_tokens"
    assert "'max_output_tokens'" in resp.json()["error"]["message"]


# ------------------------------------------------------------------ units


def test_input_items_become_chat_messages():
    messages = input_messages(
        [
            {"role": "user", "content": "Weather?"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
            {"type": "function_call", "call_id": "c2", "name": "get_time", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        ]
    )
    assert isinstance(messages[0], UserMessage)
    assistant = messages[1]
    assert isinstance(assistant, AssistantMessage) and assistant.content == "Checking."
    assert [c.id for c in assistant.tool_calls] == ["c1", "c2"]
    assert isinstance(messages[2], ToolMessage) and messages[2].tool_call_id == "c1" and len(messages) == 3
    with pytest.raises(APIError) as err:
        input_messages([{"role": "user", "content": 5}])
    assert err.value.param == "input[0].content"


def _record(rid: str, size: int = 0) -> StoredResponse:
    response = ResponseObject(
        id=rid,
        created_at=0,
        model=MODEL,
        status="completed",
        output=[OutputMessage(id="msg_1", content=[OutputText(text="x" * size)])],
    )
    return StoredResponse(
        response=response,
        turn=StoredTurn(
            messages=[UserMessage(content="hi")], prompt_text="p", prompt_ids=[1, 2], output_text="o", output_ids=[3]
        ),
    )


def test_store_bounds_count_and_bytes_oldest_first(tmp_path):
    store = ResponseStore(tmp_path, max_count=3, max_bytes=10_000)
    ids = [new_response_id() for _ in range(4)]
    for rid in ids:
        store.put("", _record(rid))
    assert store.get("", ids[0]) is None and all(store.get("", r) for r in ids[1:])
    big = new_response_id()
    store.put("", _record(big, size=9_000))
    assert store.get("", big) is not None and store.get("", ids[1]) is None
    # a new process sees what is on disk, in the same order
    again = ResponseStore(tmp_path, max_count=3, max_bytes=10_000)
    assert again.get("", big).turn.prompt_ids == [1, 2]
    again.put("t1", _record(ids[0]))
    assert again.get("", ids[0]) is None and again.get("t1", ids[0]) is not None


def test_store_refuses_bad_ids_and_reads_damaged_files_as_absent(tmp_path):
    store = ResponseStore(tmp_path, max_count=3, max_bytes=10_000)
    assert store.get("", "../etc/passwd") is None and store.delete("", "resp_x") is False
    rid = new_response_id()
    store.put("", _record(rid))
    (tmp_path / "_default" / f"{rid}.json").write_text("{not json")
    assert store.get("", rid) is None


def test_render_continuation_extends_the_exact_ids(tokenizer):
    """The chained prompt starts with the previous prompt ids + the generated ids (a stop token
    included), even where re-tokenizing the text would split it differently."""
    renderer = PromptRenderer(tokenizer)
    first = [UserMessage(content="Say a number.")]
    prompt = renderer.render_chat(first, None, None)
    output_text = " 12345"  # tokenized alone, the leading space may merge differently in context
    output_ids = [tokenizer.convert_tokens_to_ids(t) for t in tokenizer.tokenize(output_text)]
    output_ids = output_ids + [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    turn = StoredTurn(
        messages=first + [AssistantMessage(content=output_text)],
        prompt_text=prompt.text,
        prompt_ids=prompt.token_ids,
        output_text=output_text,
        output_ids=output_ids,
        tokenizer=renderer.tokenizer_fingerprint,
    )
    chained = turn.messages + [UserMessage(content="Another.")]
    rendered = renderer.render_continuation(chained, None, None, turn)
    head = prompt.token_ids + output_ids
    assert rendered.token_ids[: len(head)] == head
    assert tokenizer.decode(rendered.token_ids) == rendered.text == renderer.render_chat(chained, None, None).text
    # different instructions change the earlier turns: a plain render, not a spliced one
    other = renderer.render_continuation(chained, None, "Use JSON.", turn)
    assert other.token_ids == renderer.render_chat(chained, None, "Use JSON.").token_ids


def test_a_turn_another_tokenizer_stored_is_rendered_afresh(tokenizer, other_tokenizer):
    """The store is shared by servers of other models: a turn whose ids another tokenizer made keeps
    its messages, never its ids (spliced in, they would be another vocabulary's tokens)."""
    theirs, ours = PromptRenderer(other_tokenizer), PromptRenderer(tokenizer)
    assert theirs.tokenizer_fingerprint != ours.tokenizer_fingerprint
    first = [UserMessage(content=f"Say {OTHER_TOKEN} a number.")]  # one token of their vocabulary only
    prompt = theirs.render_chat(first, None, None)
    assert other_tokenizer.convert_tokens_to_ids(OTHER_TOKEN) in prompt.token_ids
    output_text = " 12"
    output_ids = theirs.encode(output_text) + [other_tokenizer.convert_tokens_to_ids("<|im_end|>")]
    turn = StoredTurn(
        messages=first + [AssistantMessage(content=output_text)],
        prompt_text=prompt.text,
        prompt_ids=prompt.token_ids,
        output_text=output_text,
        output_ids=output_ids,
        tokenizer=theirs.tokenizer_fingerprint,
    )
    chained = turn.messages + [UserMessage(content="Another.")]
    spliced = theirs.render_continuation(chained, None, None, turn).token_ids  # their own next turn: spliced
    assert spliced[: len(prompt.token_ids) + len(output_ids)] == prompt.token_ids + output_ids
    rendered = ours.render_continuation(chained, None, None, turn)
    assert rendered.token_ids == ours.render_chat(chained, None, None).token_ids
    assert max(rendered.token_ids) < len(tokenizer)  # no id of the other vocabulary
    untagged = msgspec.structs.replace(turn, tokenizer="")  # a record from before turns were tagged
    assert ours.render_continuation(chained, None, None, untagged).token_ids == rendered.token_ids


def test_store_flags_reach_the_settings_and_the_store_folder(tmp_path):
    from gateway.app import build_response_store
    from gateway.cli import build_parser, serve_settings

    args = build_parser().parse_args(
        [
            "serve",
            "--registry-dir",
            str(tmp_path / "registry"),
            "--responses-max-stored",
            "7",
            "--responses-max-bytes",
            "4096",
        ]
    )
    settings = serve_settings(args, environ={}).gateway
    assert (settings.responses_max_stored, settings.responses_max_bytes) == (7, 4096)
    store = build_response_store(settings)
    assert (store.root, store.max_count, store.max_bytes) == (tmp_path / "responses", 7, 4096)
    with pytest.raises(ValueError, match="--responses-max-stored"):
        serve_settings(build_parser().parse_args(["serve", "--responses-max-stored", "0"]), environ={})


def test_stream_disconnect_aborts_the_engine_request_and_stores_nothing(fake_engine, gateway_grammar, tmp_path):
    """A client that leaves mid-stream: its engine request is aborted, the permit released, the
    request counted as cancelled, and no half response is stored."""
    import asyncio

    import msgspec

    from gateway.app import create_app
    from gateway.settings import Settings

    fake_engine.reply = lambda req: "x" * 300  # 100 events
    fake_engine.delay = 0.01
    app = create_app(fake_engine, gateway_grammar, Settings(registry_dir=str(tmp_path / "reg")))
    body = msgspec.json.encode({"model": MODEL, "input": "hi", "stream": True})
    sent: list[dict] = []

    async def drive() -> None:
        gone, body_sent = asyncio.Event(), False

        async def receive():
            nonlocal body_sent
            if not body_sent:
                body_sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(message):
            sent.append(message)
            if len([m for m in sent if m["type"] == "http.response.body" and m.get("body")]) >= 5:
                gone.set()  # the client leaves after five events

        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": "/v1/responses",
            "raw_path": b"/v1/responses",
            "query_string": b"",
            "root_path": "",
            "headers": [(b"content-type", b"application/json"), (b"host", b"test")],
            "client": ("127.0.0.1", 1),
            "server": ("127.0.0.1", 8000),
            "state": {},
        }
        await asyncio.wait_for(app(scope, receive, send), timeout=20)

    asyncio.run(drive())
    rid = fake_engine.submitted[0].rid
    assert rid in fake_engine.aborted
    services = app.state.services
    assert services.limiter.in_flight == 0
    assert services.metrics.requests_counted("responses", "cancelled") == 1
    assert not list((tmp_path / "responses").glob("*/resp_*.json"))


# ------------------------------------------------------------------ tools + format on chat completions


ANSWER_TEXT = '<tool_call>{"name":"final_answer","arguments":{"city":"Paris"}}</tool_call>'
CHAT_TOOL = {"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}
CHAT_FORMAT = {"type": "json_schema", "json_schema": {k: v for k, v in CITY_FORMAT.items() if k != "type"}}


def test_chat_tools_with_a_format_answer_as_content(gateway_client, fake_engine):
    """OpenAIChatCompletionsModel with an output_type and tools sends both to chat completions."""
    fake_engine.reply = lambda req: ANSWER_TEXT
    client = gateway_client()
    body = client.post(
        "/v1/chat/completions",
        json={
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [CHAT_TOOL],
            "response_format": CHAT_FORMAT,
        },
    ).json()
    choice = body["choices"][0]
    assert json.loads(choice["message"]["content"]) == {"city": "Paris"} and "tool_calls" not in choice["message"]
    assert choice["finish_reason"] == "stop"
    fake_engine.reply = lambda req: CALL_TEXT  # a real tool call stays a tool call
    body = client.post(
        "/v1/chat/completions",
        json={
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [CHAT_TOOL],
            "response_format": CHAT_FORMAT,
        },
    ).json()
    assert body["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert body["choices"][0]["finish_reason"] == "tool_calls"


def test_chat_tools_with_a_format_stream_the_answer_as_content(gateway_client, fake_engine):
    fake_engine.reply = lambda req: ANSWER_TEXT
    resp = gateway_client().post(
        "/v1/chat/completions",
        json={
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [CHAT_TOOL],
            "response_format": CHAT_FORMAT,
            "stream": True,
        },
    )
    chunks = [json.loads(b[len("data: ") :]) for b in resp.text.split("\n\n") if b.startswith("data: {")]
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert not any("tool_calls" in d for d in deltas)
    assert json.loads("".join(d.get("content", "") for d in deltas)) == {"city": "Paris"}
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_tools_with_a_non_object_format_are_refused(gateway_client):
    fmt = {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "integer"}}}
    resp = gateway_client().post(
        "/v1/chat/completions",
        json={
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [CHAT_TOOL],
            "response_format": fmt,
        },
    )
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "response_format"
