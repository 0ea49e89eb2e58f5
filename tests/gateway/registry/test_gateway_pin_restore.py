"""Registry pins survive a restart: the pin is recorded with the schema and re-applied at start.
The registry on real files; the restart as a new app over a new fake engine on the same folder."""

from __future__ import annotations

import logging

import pytest
from litestar.testing import TestClient

from gateway.app import create_app
from gateway.pipeline.schema_registry import SchemaRegistry
from gateway.registry.pinning import pin_name
from gateway.settings import Settings
from tests.fake_engine import FakeEngine

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
SYSTEM = "You answer with a city."


def put(registry: SchemaRegistry, tenant: str = "", schema: dict = SCHEMA):
    entry, _ = registry.put(tenant, "json_schema", schema, repr(schema))
    return entry


def test_a_pin_record_outlives_the_registry_object(tmp_path):
    entry = put(SchemaRegistry(tmp_path))
    other = put(SchemaRegistry(tmp_path), tenant="acme", schema={"type": "string"})
    first = SchemaRegistry(tmp_path)
    assert first.set_pin("", entry.id, SYSTEM) and first.set_pin("acme", other.id, None)
    restarted = SchemaRegistry(tmp_path)
    pinned = {(p.tenant, p.entry.id, p.system_prompt) for p in restarted.pinned()}
    assert pinned == {("", entry.id, SYSTEM), ("acme", other.id, None)}
    assert [e.id for e in restarted.list("")] == [entry.id]  # the pin record is not an entry


def test_deleting_an_entry_drops_its_pin_and_unknown_ids_are_not_pinned(tmp_path):
    registry = SchemaRegistry(tmp_path)
    entry = put(registry)
    assert not registry.set_pin("", "sch_" + "0" * 24, None)
    registry.set_pin("", entry.id, SYSTEM)
    assert registry.delete("", entry.id)
    assert SchemaRegistry(tmp_path).pinned() == []


def serve(engine: FakeEngine, grammar, registry_dir) -> TestClient:
    """A server over `registry_dir`; `with` it to run its start-up hooks (the pins' restore)."""
    return TestClient(create_app(engine, grammar, Settings(registry_dir=str(registry_dir))))


def upload(client: TestClient, pin: bool = True) -> dict:
    resp = client.post("/v1/schemas", json={"schema": SCHEMA, "pin": pin, "system_prompt": SYSTEM})
    assert resp.status_code == 201, resp.text
    return resp.json()


def test_pins_come_back_after_a_restart(tokenizer, gateway_grammar, tmp_path):
    first_engine = FakeEngine(tokenizer, pin_budget=4096)
    with serve(first_engine, gateway_grammar, tmp_path) as client:
        uploaded = upload(client)
        schema_id, pinned_tokens = uploaded["id"], uploaded["pinned_tokens"]
        unpinned = client.post("/v1/schemas", json={"schema": {"type": "string"}})
        assert unpinned.status_code == 201, unpinned.text

    restarted_engine = FakeEngine(tokenizer, pin_budget=4096)  # a new process: nothing pinned yet
    with serve(restarted_engine, gateway_grammar, tmp_path):
        assert restarted_engine.pins == {("", pin_name(schema_id)): pinned_tokens}
        assert restarted_engine.pins == first_engine.pins  # same prefix: same system prompt and schema text


def test_a_pin_that_no_longer_fits_is_logged_and_the_server_starts(tokenizer, gateway_grammar, tmp_path, caplog):
    with serve(FakeEngine(tokenizer, pin_budget=4096), gateway_grammar, tmp_path) as client:
        uploaded = upload(client)

    small = FakeEngine(tokenizer, pin_budget=1)
    with (
        caplog.at_level(logging.WARNING, logger="jumpgate.gateway.pinning"),
        serve(small, gateway_grammar, tmp_path) as client,
    ):
        assert small.pins == {}
        assert any("could not re-pin" in r.getMessage() for r in caplog.records)
        assert client.get("/health").status_code == 200
        assert client.get(f"/v1/schemas/{uploaded['id']}").status_code == 200  # the entry itself stays


@pytest.mark.parametrize("pin", [False, True])
def test_only_pinned_uploads_are_recorded(tokenizer, gateway_grammar, tmp_path, pin):
    with serve(FakeEngine(tokenizer, pin_budget=4096), gateway_grammar, tmp_path) as client:
        uploaded = upload(client, pin)
    assert [p.entry.id for p in SchemaRegistry(tmp_path).pinned()] == ([uploaded["id"]] if pin else [])
