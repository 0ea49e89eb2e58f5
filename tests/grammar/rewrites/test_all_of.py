"""grammar/rewrites/all_of.py: an allOf of object schemas compiles as the one object it equals (issue #42
item 9: SchemaStore's bitbucket-pipelines left `image` to check-and-roll-back, which spent its
rewrites on `true`, `false`, `null`...)."""

from __future__ import annotations

import importlib.util
import itertools
import json
from pathlib import Path

import jsonschema
import pytest

from grammar import GrammarSpec
from grammar.rewrites.all_of import distributed_any_of, lower_all_of, merged_all_of, partly_merged_all_of
from grammar.rewrites.lowering import lower_for_masks
from grammar.validation.fidelity import ENFORCED, spec_fidelity

BASE = {"type": "object", "properties": {"name": {"type": "string"}, "uid": {"type": "integer"}}, "required": ["name"]}
# bitbucket-pipelines' image, cut down: three object forms (one forbids the others' names) or a name
IMAGE = {
    "definitions": {
        "base": BASE,
        "no_auth": {
            "allOf": [
                {"$ref": "#/definitions/base"},
                {"type": "object", "properties": {"password": {"not": {}}, "username": {"not": {}}}},
            ]
        },
        "basic_auth": {
            "allOf": [
                {"$ref": "#/definitions/base"},
                {
                    "type": "object",
                    "properties": {"password": {"type": "string"}, "username": {"type": "string"}},
                    "required": ["username", "password"],
                },
            ]
        },
    },
    "type": "object",
    "properties": {
        "image": {
            "oneOf": [{"$ref": "#/definitions/no_auth"}, {"$ref": "#/definitions/basic_auth"}, {"type": "string"}]
        }
    },
    "required": ["image"],
}


def test_a_ref_and_an_extension_merge_into_one_object():
    node = {
        "allOf": [
            {"$ref": "#/definitions/base"},
            {"properties": {"tag": {"type": "string"}}, "required": ["tag"], "minProperties": 2},
        ],
        "description": "d",
    }
    merged = merged_all_of(node, {"definitions": {"base": BASE}})
    assert merged == {
        "description": "d",
        "type": "object",
        "properties": {"name": {"type": "string"}, "uid": {"type": "integer"}, "tag": {"type": "string"}},
        "required": ["name", "tag"],
        "minProperties": 2,
    }


def test_types_intersect_and_shared_names_merge_their_subschemas():
    node = {
        "type": ["object", "null"],
        "allOf": [
            {"type": "object", "properties": {"a": {"type": "number"}}},
            {"properties": {"a": {"type": ["integer", "string"]}}, "maxProperties": 3},
            {"maxProperties": 5},
        ],
    }
    assert merged_all_of(node, node) == {"type": "object", "properties": {"a": {"type": "integer"}}, "maxProperties": 3}


@pytest.mark.parametrize(
    "node",
    [
        {"allOf": [BASE, {"additionalProperties": False}]},  # closes over one branch's names only
        {"allOf": [BASE, {"patternProperties": {"^x": {}}}]},
        {"allOf": [BASE, {"if": {"required": ["uid"]}, "then": {"required": ["name"]}}]},
        {"allOf": [BASE, {"anyOf": [{"required": ["uid"]}]}]},
        {"allOf": [{"$ref": "#/nowhere"}, BASE]},
        {"allOf": [{"type": "string"}, {"type": "object"}]},  # nothing is both: left to the check
        {"allOf": [{"type": "number"}, {"not": {"type": "integer"}}]},
        {
            "allOf": [
                BASE,
                {"properties": {"name": {"type": "string", "pattern": "a"}}},
                {"properties": {"name": {"anyOf": [{"type": "string"}]}}},
            ]
        },  # a name that cannot merge
        {"allOf": [BASE]},  # a lone branch compiles as it is
    ],
)
def test_what_one_object_cannot_say_is_left_as_written(node):
    assert merged_all_of(node, {}) is None


def test_the_merge_accepts_exactly_what_the_all_of_accepts():
    node = {
        "type": "object",
        "allOf": [
            {
                **BASE,
                "properties": {
                    **BASE["properties"],
                    "meta": {"type": "object", "properties": {"a": {"type": "integer"}}},
                },
            },
            {
                "properties": {
                    "name": {"type": "string"},
                    "tag": {"type": "string"},
                    "meta": {"properties": {"b": {"type": "string"}}, "required": ["b"]},
                },
                "required": ["tag"],
                "maxProperties": 3,
            },
        ],
    }
    merged = merged_all_of(node, node)
    assert merged is not None and "allOf" not in merged["properties"]["meta"]
    values = [None, 1, "x", [], {}]
    names = {
        "name": ["a", 1],
        "uid": [2, "2"],
        "tag": ["t", None],
        "other": [0],
        "meta": [{"b": "x"}, {"a": 1}, {"a": "1", "b": "x"}, 3],
    }
    objects = [
        dict(zip(keys, combo))
        for r in range(len(names) + 1)
        for keys in itertools.combinations(names, r)
        for combo in itertools.product(*(names[k] for k in keys))
    ]
    for value in values + objects:
        assert jsonschema.Draft202012Validator(node).is_valid(value) == jsonschema.Draft202012Validator(
            merged
        ).is_valid(value), value


def test_lowering_merges_nested_all_ofs_and_fidelity_says_enforced():
    lowered = lower_all_of(IMAGE)
    assert "allOf" not in lowered["definitions"]["no_auth"]
    report = spec_fidelity("json_schema", IMAGE, strict=True, retries=4)
    assert report.refused_in_strict == ()
    assert all(k.status == ENFORCED for k in report.keywords if k.keyword == "allOf")


def test_the_mask_keeps_a_scalar_out_of_an_object_or_string_value(service, tokenizer):
    handle = service.compile(GrammarSpec("json_schema", IMAGE, True))

    def writes(text: str) -> bool:
        matcher = handle.new_matcher()
        return all(matcher.accept(t) for t in tokenizer.encode(text, add_special_tokens=False))

    assert writes('{"image":"atlassian/default-image:4"}')
    assert writes('{"image":{"name":"node","password":"p","username":"u"}}')
    assert not writes('{"image":true')  # before: any JSON value, left to the check
    assert not writes('{"image":{"uid":1}')  # `name` is required by the base


# taskfile's root, cut down: closed properties beside an anyOf of "at least one of these names"
AT_LEAST_ONE = {
    "type": "object",
    "additionalProperties": False,
    "required": ["version"],
    "properties": {"version": {"type": "string"}, "includes": {"type": "object"}, "tasks": {"type": "object"}},
    "anyOf": [{"required": ["includes"]}, {"required": ["tasks"]}],
}


def test_keywords_beside_an_any_of_distribute_into_its_branches():
    spread = distributed_any_of(AT_LEAST_ONE, AT_LEAST_ONE)
    assert [b["required"] for b in spread["anyOf"]] == [["version", "includes"], ["version", "tasks"]]
    assert all(
        b["additionalProperties"] is False and set(b["properties"]) == {"version", "includes", "tasks"}
        for b in spread["anyOf"]
    )
    # a branch naming properties of its own would change what additionalProperties: false means
    assert distributed_any_of({**AT_LEAST_ONE, "anyOf": [{"properties": {"x": {}}}]}, {}) is None
    report = spec_fidelity("json_schema", AT_LEAST_ONE, strict=True)
    assert report.refused_in_strict == ()


def test_the_mask_keeps_names_beside_an_any_of(service, tokenizer):
    handle = service.compile(GrammarSpec("json_schema", AT_LEAST_ONE, True))

    def writes(text: str) -> bool:
        matcher = handle.new_matcher()
        return all(matcher.accept(t) for t in tokenizer.encode(text, add_special_tokens=False))

    assert writes('{"version":"3","tasks":{}}')
    assert not writes('{"{":100')  # before: only the anyOf was compiled, any name went
    assert not writes('{"version":"3"}')  # neither includes nor tasks


# dependabot's root, cut down: closed properties beside an allOf of a conditional, which no mask keeps
# (not on a listed property, so llguidance does not keep it either: the schema stays with xgrammar)
CONDITIONAL = {
    "type": "object",
    "additionalProperties": False,
    "required": ["version"],
    "properties": {
        "version": {"type": "integer"},
        "beta": {"type": "boolean"},
        "updates": {"type": "array", "items": {"type": "string"}},
    },
    "allOf": [
        {
            "if": {"properties": {"version": {"minimum": 3}}, "required": ["version"]},
            "then": {},
            "else": {"properties": {"updates": {"maxItems": 1}}},
        }
    ],
}


def test_an_all_of_that_cannot_merge_still_masks_what_is_beside_it(service, tokenizer):
    report = spec_fidelity("json_schema", CONDITIONAL, strict=True, retries=0)
    statuses = {k.pointer: k.status for k in report.keywords}
    assert statuses["/allOf/0/if"] != ENFORCED and statuses["/allOf/0/else"] != ENFORCED  # the check keeps it
    assert all(statuses[f"/{k}"] == ENFORCED for k in ("type", "properties", "required", "additionalProperties"))
    handle = service.compile(GrammarSpec("json_schema", CONDITIONAL, True))

    def writes(text: str) -> bool:
        matcher = handle.new_matcher()
        return all(matcher.accept(t) for t in tokenizer.encode(text, add_special_tokens=False))

    assert writes('{"version":2,"updates":["a","b"]}')  # the conditional is left to the check
    assert not writes('{"versio":')  # before: the node compiled as any JSON value
    assert not writes('{"updates":[]}')  # version is required


# compose-spec's service: two parts, each with its own properties and an `^x-` pattern, closed by
# `unevaluatedProperties: false` beside the allOf
CONTAINER = {"type": "object", "properties": {"image": {"type": "string"}, "ports": {"type": "array"}}}
WORKLOAD = {"type": "object", "properties": {"scale": {"type": "integer"}, "image": {"minLength": 1}}}
SERVICE = {
    "$defs": {
        "container": {**CONTAINER, "patternProperties": {"^x-": {}}},
        "workload": {**WORKLOAD, "patternProperties": {"^x-": {}, "^l-": {"type": "string"}}},
    },
    "allOf": [{"$ref": "#/$defs/container"}, {"$ref": "#/$defs/workload"}],
    "properties": {"restart": {"enum": ["no", "always"]}},
    "required": ["image"],
    "unevaluatedProperties": False,
}


def test_unevaluated_properties_beside_an_all_of_close_the_union_of_its_parts():
    merged = merged_all_of(SERVICE, SERVICE)
    assert merged is not None and merged["additionalProperties"] is False
    assert set(merged["properties"]) == {"image", "ports", "scale", "restart"}
    assert merged["patternProperties"] == {"^x-": {}, "^l-": {"type": "string"}}
    values = [None, "x", {}]
    names = {
        "image": ["a", "", 1],
        "ports": [[], "80"],
        "scale": [2, "2"],
        "restart": ["always", "sometimes"],
        "x-extra": [{"any": 1}],
        "l-label": ["a", 1],
        "other": [0],
    }
    objects = [
        dict(zip(keys, combo))
        for r in range(4)
        for keys in itertools.combinations(names, r)
        for combo in itertools.product(*(names[k] for k in keys))
    ]
    for value in values + objects:
        assert jsonschema.Draft202012Validator(SERVICE).is_valid(value) == jsonschema.Draft202012Validator(
            {**merged, "$defs": SERVICE["$defs"]}
        ).is_valid(value), value


@pytest.mark.parametrize(
    "part",
    [
        {"properties": {"a": {}}, "additionalProperties": {"type": "string"}},  # evaluates every name
        {"properties": {"a": {}}, "unevaluatedProperties": False},
        {"properties": {"a": {}}, "anyOf": [{"required": ["a"]}]},  # evaluates what its branches do
    ],
)
def test_a_part_that_evaluates_names_its_own_way_is_left_as_written(part):
    assert merged_all_of({"allOf": [CONTAINER, part], "unevaluatedProperties": False}, {}) is None


# dependabot's update: a closed object, required names chosen by a oneOf of parts naming its own
# properties, and a conditional (left to check-and-roll-back)
UPDATE = {
    "type": "object",
    "additionalProperties": False,
    "properties": {"eco": {"type": "string"}, "dir": {"type": "string"}, "dirs": {"type": "array"}},
    "required": ["eco"],
    "allOf": [
        {"if": {"not": {"required": ["group"]}}, "then": {"required": ["eco"]}},
        {
            "oneOf": [
                {"properties": {"dirs": {"$ref": "#/properties/dirs"}}, "required": ["dirs"]},
                {"properties": {"dir": {"$ref": "#/properties/dir"}}, "required": ["dir"]},
            ]
        },
    ],
}


def test_a_part_naming_only_a_closed_parts_properties_merges_with_it():
    node = {"allOf": [{**UPDATE["properties"]["dir"]}], **{k: v for k, v in UPDATE.items() if k != "allOf"}}
    node["allOf"] = [{"properties": {"dir": {"minLength": 1}}, "required": ["dir"]}]
    merged = merged_all_of(node, node)
    assert merged["additionalProperties"] is False and merged["required"] == ["eco", "dir"]
    assert merged["properties"]["dir"] == {"type": "string", "minLength": 1}
    for value in [{"eco": "a", "dir": "x"}, {"eco": "a", "dir": ""}, {"eco": "a"}, {"eco": "a", "dir": "x", "o": 1}]:
        assert jsonschema.Draft202012Validator(node).is_valid(value) == jsonschema.Draft202012Validator(
            merged
        ).is_valid(value), value


def test_the_mask_takes_a_left_out_one_of_as_the_any_of_of_its_merged_branches():
    masked = partly_merged_all_of(UPDATE, UPDATE)
    assert [b["required"] for b in masked["anyOf"]] == [["eco", "dirs"], ["eco", "dir"]]
    assert all(b["additionalProperties"] is False for b in masked["anyOf"])
    # sound: whatever the allOf accepts, the mask's schema accepts
    for value in [{"eco": "a", "dir": "x"}, {"eco": "a", "dirs": []}, {"eco": "a"}, {"dir": "x"}, {"eco": "a", "o": 1}]:
        if jsonschema.Draft202012Validator(UPDATE).is_valid(value):
            assert jsonschema.Draft202012Validator({**masked, "properties": UPDATE["properties"]}).is_valid(value)
        assert not jsonschema.Draft202012Validator(masked).is_valid({"eco": "a"})  # a directory is required now


# dependabot's update as written: schedule required unless a group is named, and exactly one of
# directory / directories; each branch names the object's own declarations by `$ref`
REAL_UPDATE = {
    "definitions": {
        "update": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "dirs": {"type": "array", "items": {"type": "string"}},
                "dir": {"type": "string"},
                "eco": {"type": "string"},
                "schedule": {"type": "object", "properties": {"interval": {"type": "string"}}},
                "group": {"type": "string", "minLength": 1},
            },
            "required": ["eco"],
            "allOf": [
                {
                    "if": {"not": {"properties": {"group": {}}, "required": ["group"]}},
                    "then": {
                        "properties": {"schedule": {"$ref": "#/definitions/update/properties/schedule"}},
                        "required": ["schedule"],
                    },
                },
                {
                    "oneOf": [
                        {
                            "properties": {"dirs": {"$ref": "#/definitions/update/properties/dirs"}},
                            "required": ["dirs"],
                        },
                        {"properties": {"dir": {"$ref": "#/definitions/update/properties/dir"}}, "required": ["dir"]},
                    ]
                },
            ],
        }
    },
    "$ref": "#/definitions/update",
}
UPDATE_VALUES = {"dirs": [["a"], [1]], "dir": ["/", 2], "eco": ["npm"], "schedule": [{}, 3], "group": ["g", ""]}


def _every_update() -> list:
    names = list(UPDATE_VALUES) + ["other"]
    values = {**UPDATE_VALUES, "other": [1]}
    return [
        dict(zip(keys, combo))
        for r in range(len(names) + 1)
        for keys in itertools.combinations(names, r)
        for combo in itertools.product(*(values[k] for k in keys))
    ]


def test_the_mask_takes_a_presence_conditional_and_an_exclusive_one_of_exactly():
    node = REAL_UPDATE["definitions"]["update"]
    masked = partly_merged_all_of(node, REAL_UPDATE)
    # schedule or a group, times directory or directories (each leaving the other out)
    assert sorted(sorted(b["required"]) for b in masked["anyOf"]) == [
        ["dir", "eco", "group"],
        ["dir", "eco", "schedule"],
        ["dirs", "eco", "group"],
        ["dirs", "eco", "schedule"],
    ]
    assert all(("dir" in b["properties"]) != ("dirs" in b["properties"]) for b in masked["anyOf"])
    original = jsonschema.Draft7Validator(REAL_UPDATE)
    mask = jsonschema.Draft7Validator({"anyOf": masked["anyOf"]})
    values = _every_update()
    assert len(values) == 324
    for value in values:
        assert original.is_valid(value) == mask.is_valid(value), value


def test_a_conditional_on_listed_values_becomes_the_mask_s_alternatives():
    schedule = {
        "type": "object",
        "properties": {"interval": {"enum": ["daily", "cron"]}, "at": {"type": "string"}},
        "required": ["interval"],
        "allOf": [
            {
                "if": {"properties": {"interval": {"const": "cron"}}},
                "then": {"properties": {"cronjob": {"type": "string"}}, "required": ["cronjob"]},
            },
            {"not": {"required": ["at", "cronjob"]}},  # left out: no choice, checked
        ],
    }
    masked = partly_merged_all_of(schedule, schedule)
    assert [b["properties"]["interval"] for b in masked["anyOf"]] == [{"enum": ["cron"]}, {"enum": ["daily"]}]
    assert masked["anyOf"][0]["required"] == ["interval", "cronjob"]
    original = jsonschema.Draft7Validator(schedule)
    mask = jsonschema.Draft7Validator({"anyOf": masked["anyOf"]})
    for interval in ["daily", "cron", "weekly", None]:
        for extra in [{}, {"cronjob": "* * * * *"}, {"cronjob": 1}, {"at": "x"}]:
            value = {**({"interval": interval} if interval else {}), **extra}
            if original.is_valid(value):
                assert mask.is_valid(value), value  # sound
            elif "at" not in value:
                assert not mask.is_valid(value), value  # and exact where the left-out part says nothing


def test_listings_in_several_parts_merge_to_the_values_all_list():
    assert merged_all_of({"allOf": [{"enum": [1, "a", True]}, {"enum": [True, 1.0, "b"]}]}, {}) == {"enum": [1, True]}
    assert merged_all_of({"allOf": [{"enum": [1]}, {"enum": [2]}]}, {}) is None


# the update as an item of a closed root, compiled for real (xgrammar: the conditional keeps llguidance out)
UPDATES = {
    "type": "object",
    "additionalProperties": False,
    "properties": {"u": {"type": "array", "items": {"$ref": "#/definitions/update"}}},
    "required": ["u"],
    "definitions": REAL_UPDATE["definitions"],
}


def test_the_mask_requires_a_schedule_unless_a_group_and_one_directory(service, tokenizer):
    handle = service.compile(GrammarSpec("json_schema", UPDATES, True))

    def writes(text: str) -> bool:
        matcher = handle.new_matcher()
        return all(matcher.accept(t) for t in tokenizer.encode(text, add_special_tokens=False))

    assert writes('{"u":[{"dir":"/","eco":"npm","schedule":{}},{"dirs":["a"],"eco":"pip","group":"g"}]}')
    assert not writes('{"u":[{"dir":"/","eco":"npm"}')  # before: closed without its schedule
    assert not writes('{"u":[{"dirs":["a"],"dir":')  # before: both directories
    assert writes('{"u":[{"dir":"/","eco":"npm","group":"g"}')  # a group instead of a schedule


def _vendored(name: str):
    """A SchemaStore schema check-jsonschema vendors (the fidelity corpus' own source), or skip."""
    spec = importlib.util.find_spec("check_jsonschema")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("check-jsonschema is not installed (pip install --no-deps check-jsonschema)")
    path = Path(spec.submodule_search_locations[0]) / "builtin_schemas" / "vendor" / f"{name}.json"
    return json.loads(path.read_text(encoding="utf-8"))


def test_dependabot_s_update_is_masked_with_its_schedule_rule_and_one_directory():
    lowered = lower_for_masks(_vendored("dependabot"), strict=True, partial_all_of=True)
    branches = lowered["definitions"]["update"]["anyOf"]
    assert sorted(sorted(set(b["required"]) - {"package-ecosystem"}) for b in branches) == [
        ["directories", "multi-ecosystem-group"],
        ["directories", "schedule"],
        ["directory", "multi-ecosystem-group"],
        ["directory", "schedule"],
    ]
    assert all(("directory" in b["properties"]) != ("directories" in b["properties"]) for b in branches)
