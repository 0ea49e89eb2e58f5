"""The on-disk schema registry: ids, persistence, atomic files, tenants, path safety."""

from __future__ import annotations

import json
import os

import pytest

from gateway.pipeline.grammar_adapter import canonical_payload_text
from gateway.pipeline.schema_registry import ForeignEntry, SchemaRegistry, schema_id, valid_id

SCHEMA = {"type": "object", "properties": {"x": {"type": "integer"}}}


def put(reg, tenant="", kind="json_schema", payload=SCHEMA, name=None):
    return reg.put(tenant, kind, payload, canonical_payload_text(kind, payload), name)


def test_same_payload_same_id(tmp_path):
    reg = SchemaRegistry(tmp_path)
    e1, created1 = put(reg, name="a")
    e2, created2 = put(reg, payload={"properties": {"x": {"type": "integer"}}, "type": "object"}, name="b")
    assert created1 and not created2 and e1.id == e2.id and e2.name == "a"
    assert valid_id(e1.id)


def test_kind_is_part_of_the_id(tmp_path):
    reg = SchemaRegistry(tmp_path)
    assert put(reg, kind="regex", payload="a+")[0].id != put(reg, kind="ebnf", payload="a+")[0].id


def test_survives_restart(tmp_path):
    entry, _ = put(SchemaRegistry(tmp_path))
    again = SchemaRegistry(tmp_path)
    assert again.get("", entry.id) == entry
    assert [e.id for e in again.list("")] == [entry.id]


def test_atomic_files_leave_no_temp(tmp_path):
    reg = SchemaRegistry(tmp_path)
    for i in range(5):
        put(reg, kind="regex", payload=f"a{{{i}}}")
    files = [f for _, _, fs in os.walk(tmp_path) for f in fs]
    assert len(files) == 5 and all(f.startswith("sch_") and f.endswith(".json") for f in files)


def test_temp_files_of_a_killed_writer_are_removed_at_start_once_stale(tmp_path):
    """A writer killed between write and rename leaves `.tmp-*.json`; a restart deletes those old
    enough that no live writer can own them, and leaves fresh ones and real entries alone."""
    entry, _ = put(SchemaRegistry(tmp_path))
    tenant_dir = next(p for p in tmp_path.iterdir() if p.is_dir())
    stale, fresh = tenant_dir / ".tmp-killed.json", tenant_dir / ".tmp-live.json"
    for f in (stale, fresh):
        f.write_text('{"half": ')
    old = os.path.getmtime(stale) - 3600
    os.utime(stale, (old, old))
    again = SchemaRegistry(tmp_path)
    assert not stale.exists() and fresh.exists()
    assert again.get("", entry.id) == entry


def test_damaged_file_reads_as_absent_and_is_rewritten(tmp_path):
    reg = SchemaRegistry(tmp_path)
    entry, _ = put(reg)
    path = next(tmp_path.rglob(f"{entry.id}.json"))
    path.write_text("{half")
    assert reg.get("", entry.id) is None and reg.list("") == []
    assert put(reg)[1] is True and reg.get("", entry.id) is not None


def another_versions_entry(path) -> bytes:
    """Whole JSON of the same entry as a later Jumpgate wrote it: a field in a form this one cannot read."""
    data = json.loads(path.read_text())
    data.update(schema_mode={"mode": "strict", "since": 2}, added_by_v2=True)
    return json.dumps(data).encode()


def test_an_entry_of_another_version_is_skipped_and_never_overwritten(tmp_path):
    reg = SchemaRegistry(tmp_path)
    entry, _ = put(reg)
    path = next(tmp_path.rglob(f"{entry.id}.json"))
    theirs = another_versions_entry(path)
    path.write_bytes(theirs)
    again = SchemaRegistry(tmp_path)  # a restart of this version on the shared folder
    assert again.get("", entry.id) is None and again.list("") == []
    with pytest.raises(ForeignEntry):
        put(again)
    assert path.read_bytes() == theirs


def test_tenants_are_isolated(tmp_path):
    reg = SchemaRegistry(tmp_path)
    entry, _ = put(reg, tenant="tabc")
    assert reg.get("tabc", entry.id) is not None
    assert reg.get("", entry.id) is None and reg.get("tother", entry.id) is None
    assert reg.delete("tother", entry.id) is False and reg.list("") == []
    assert reg.delete("tabc", entry.id) is True and reg.get("tabc", entry.id) is None


@pytest.mark.parametrize(
    "bad",
    [
        "../x",
        "sch_../../etc",
        "sch_XYZ",
        "sch_" + "a" * 8,
        "sch_" + "a" * 65,
        "/etc/passwd",
        "sch_" + "a" * 16 + "/..",
        "",
    ],
)
def test_ids_cannot_escape(tmp_path, bad):
    reg = SchemaRegistry(tmp_path / "reg")
    assert not valid_id(bad)
    assert reg.get("", bad) is None and reg.delete("", bad) is False


@pytest.mark.parametrize("tenant", ["../x", "a/b", "_default", "x" * 65])
def test_bad_tenants_refused(tmp_path, tenant):
    with pytest.raises(ValueError):
        SchemaRegistry(tmp_path).list(tenant)


def test_schema_id_format():
    assert valid_id(schema_id("anything")) and schema_id("a") != schema_id("b")
