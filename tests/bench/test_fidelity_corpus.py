"""bench/fidelity/corpus.py: the handmade source, BFCL type normalisation, Kubernetes ref inlining,
dedupe and order; each package source only where its package is installed (the `corpus` extra,
which CI does not install). The packages are looked up with find_spec, as the builder does, not
with pytest.importorskip: installed with --no-deps (as documented), two of them fail to import."""

from __future__ import annotations

import json

import jsonschema
import pytest

from bench.fidelity import corpus as fc
from bench.fidelity.corpus import K8sDefinitions, Skip, build_corpus, canonical, normalise_bfcl, schema_refs


def test_handmade_source_is_every_corpus_file_in_name_order():
    entries, stats = build_corpus(["handmade"])
    files = sorted(fc.HANDMADE_DIR.glob("*.json"))
    assert [e.name for e in entries] == [p.stem for p in files]
    assert all(e.source == "handmade" for e in entries)
    assert entries[0].schema == json.loads(files[0].read_text())
    assert stats["handmade"].as_dict() == {
        "available": True,
        "version": None,
        "read": len(files),
        "kept": len(files),
        "duplicates": 0,
        "skipped": {},
    }
    assert build_corpus(["handmade"])[0] == entries  # deterministic


def test_unknown_source_is_refused():
    with pytest.raises(ValueError, match="unknown corpus source"):
        build_corpus(["handmade", "nope"])


def test_dedupe_by_canonical_json_and_unique_names(monkeypatch):
    def fake(stats):
        yield "a", {"type": "object", "properties": {"x": {"type": "string"}}}
        yield "b", {"properties": {"x": {"type": "string"}}, "type": "object"}  # same, other key order
        yield "a", {"type": "string"}  # same name, other schema
        yield "c", {"type": "integer"}

    monkeypatch.setitem(fc.READERS, "handmade", fake)
    entries, stats = build_corpus(["handmade"])
    assert [e.name for e in entries] == ["a", "a#2", "c"]
    assert stats["handmade"].duplicates == 1 and stats["handmade"].kept == 3


def test_bfcl_types_normalised_to_json_schema():
    bfcl = {
        "type": "dict",
        "properties": {
            "ratio": {"type": "float", "description": "a float"},
            "point": {"type": "tuple", "items": {"type": "float"}},
            "anything": {"type": "any", "description": "kept, untyped"},
            "options": {"type": "dict", "properties": {"deep": {"type": "array", "items": {"type": "dict"}}}},
            "java_map": {"type": "HashMap"},
            "java_list": {"type": "ArrayList", "items": {"type": "String"}},
            "count": {"type": "long", "default": 3, "optional": True},
            "either": {"type": ["float", "any", "null"]},
            "odd": {"type": ""},
        },
        "required": ["ratio"],
    }
    out = normalise_bfcl(bfcl)
    props = out["properties"]
    assert out["type"] == "object" and out["required"] == ["ratio"]
    assert props["ratio"] == {"type": "number", "description": "a float"}
    assert props["point"] == {"type": "array", "items": {"type": "number"}}
    assert props["anything"] == {"description": "kept, untyped"}
    assert props["options"]["properties"]["deep"] == {"type": "array", "items": {"type": "object"}}
    assert props["java_map"] == {"type": "object"}
    assert props["java_list"] == {"type": "array", "items": {"type": "string"}}
    assert props["count"] == {"type": "integer", "default": 3, "optional": True}
    assert props["either"] == {"type": ["number", "null"]}
    assert props["odd"] == {}
    assert bfcl["type"] == "dict"  # the input is not changed
    jsonschema.Draft202012Validator.check_schema(out)
    # a property *named* like a keyword is a name, not a type
    assert normalise_bfcl({"type": "dict", "properties": {"type": {"type": "float"}}}) == {
        "type": "object",
        "properties": {"type": {"type": "number"}},
    }


def test_bfcl_types_are_normalised_wherever_the_keyword_table_puts_a_schema():
    # grammar/schema/keyword_sets.py: draft-7 `dependencies` of schemas too (a name list is data)
    out = normalise_bfcl({"type": "dict", "dependencies": {"a": {"type": "float"}, "b": ["a"]}})
    assert out == {"type": "object", "dependencies": {"a": {"type": "number"}, "b": ["a"]}}


def test_kubernetes_kind_gets_the_closure_of_its_definitions():
    defs = K8sDefinitions(
        {
            "a.Meta": {"type": "object", "properties": {"labels": {"$ref": "#/$defs/a.Labels"}}},
            "a.Labels": {"type": "object", "additionalProperties": {"type": "string"}},
            "a.Node": {"type": "object", "properties": {"child": {"$ref": "#/$defs/a.Node"}}},  # recursive
            "a.Unused": {"type": "string"},
        }
    )
    kind = {
        "$id": "https://kubernetes.io/api/x/v1",
        "type": "object",
        "properties": {
            "metadata": {"$ref": "/api/_definitions.json#/$defs/a.Meta", "description": "m"},
            "tree": {"$ref": "/api/_definitions.json#/$defs/a.Node"},
        },
    }
    out = defs.inline(kind)
    assert "$id" not in out
    assert out["properties"]["metadata"] == {"$ref": "#/$defs/a.Meta", "description": "m"}
    assert sorted(out["$defs"]) == ["a.Labels", "a.Meta", "a.Node"]
    assert out["$defs"]["a.Meta"]["properties"]["labels"] == {"$ref": "#/$defs/a.Labels"}
    v = jsonschema.Draft202012Validator(out)
    assert v.is_valid({"metadata": {"labels": {"k": "v"}}, "tree": {"child": {}}})
    assert not v.is_valid({"metadata": {"labels": {"k": 1}}})
    with pytest.raises(Skip):
        defs.inline({"properties": {"x": {"$ref": "other.json#/definitions/y"}}})
    with pytest.raises(Skip):
        defs.inline({"properties": {"x": {"$ref": "#/$defs/missing"}}})


def _installed(source: str) -> None:
    module, dist = fc.PACKAGES[source]
    if fc.package_dir(module) is None:
        pytest.skip(f"{dist} is not installed (the `corpus` extra; pip install --no-deps {dist})")


def test_kubernetes_source_is_self_contained():
    _installed("kubernetes")
    entries, stats = build_corpus(["kubernetes"])
    assert stats["kubernetes"].version.endswith("-local-strict")
    assert len(entries) > 500
    names = {e.name for e in entries}
    assert "pod-v1" in names and "deployment-apps-v1" in names
    for e in entries:
        for ref in schema_refs(e.schema):
            assert ref.startswith("#/$defs/") and ref[len("#/$defs/") :] in e.schema["$defs"], (e.name, ref)
    pod = next(e for e in entries if e.name == "pod-v1").schema
    v = jsonschema.Draft202012Validator(pod)
    assert v.is_valid(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "web"},
            "spec": {"containers": [{"name": "web", "image": "nginx"}]},
        }
    )
    assert not v.is_valid({"kind": "Pod", "spec": {"containers": [{"image": "nginx"}]}})  # container name


def test_schemastore_source_has_only_local_refs():
    _installed("schemastore")
    entries, stats = build_corpus(["schemastore"])
    assert len(entries) >= 20 and "github-workflows" in {e.name for e in entries}
    assert all(ref.startswith("#") for e in entries for ref in schema_refs(e.schema))
    assert stats["schemastore"].skipped.get("non_local_ref", 0) == stats["schemastore"].read - len(entries)


def test_bfcl_source_is_json_schema():
    _installed("bfcl")
    entries, stats = build_corpus(["bfcl"])
    assert len(entries) > 1000 and stats["bfcl"].duplicates > 0

    def types(node):
        if isinstance(node, dict):
            t = node.get("type")
            if isinstance(t, (str, list)):
                yield from ([t] if isinstance(t, str) else t)
            for value in node.values():
                yield from types(value)
        elif isinstance(node, list):
            for value in node:
                yield from types(value)

    # "type" may also be a property's name; the keyword's values are JSON Schema types only
    seen = {t for e in entries for t in types(e.schema) if isinstance(t, str)}
    assert not seen & set(fc.BFCL_TYPES)
    assert all(e.schema.get("type") == "object" for e in entries[:50])


def test_whole_corpus_has_500_unique_schemas():
    for source in ("kubernetes", "schemastore", "bfcl"):
        _installed(source)
    entries, _ = build_corpus()
    assert len(entries) >= 500
    assert len({canonical(e.schema) for e in entries}) == len(entries)
    assert [e.source for e in entries] == sorted((e.source for e in entries), key=fc.SOURCES.index)


def test_missing_packages_leave_only_the_handmade_source(monkeypatch):
    monkeypatch.setattr(fc, "package_dir", lambda module: None)  # as in CI, where `corpus` is not installed
    entries, stats = build_corpus()
    assert {e.source for e in entries} == {"handmade"}
    assert [s for s, st in stats.items() if not st.available] == ["kubernetes", "schemastore", "bfcl"]
