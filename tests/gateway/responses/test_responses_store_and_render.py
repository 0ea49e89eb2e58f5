"""/v1/responses' parts on their own: the response store, the input-item conversion, the exact-prefix
rendering of a chained turn with the real SmolLM2 tokenizer and chat template, the store flags, and
a stream disconnect aborting the engine request."""

from __future__ import annotations

import msgspec
import pytest

from gateway.errors import APIError
from gateway.pipeline.prompt import PromptRenderer
from gateway.protocol import AssistantMessage, ToolMessage, UserMessage
from gateway.responses.items import input_messages
from gateway.responses.protocol import OutputMessage, OutputText, ResponseObject
from gateway.responses.store import ResponseStore, StoredResponse, StoredTurn, new_response_id
from tests.conftest import OTHER_TOKEN
from tests.gateway.responses.responses_helpers import MODEL

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
