"""`if`/`then`/`else` on a discriminator (grammar/rewrites/conditionals.py): the lowered `anyOf` accepts
exactly the instances the original accepts, llguidance's matcher refuses what the branch forbids,
strict mode answers it, and the real model's answer through a real server validates. The same for
an `allOf` of conditionals on one property declared beside it (SchemaStore's discriminated unions:
GitHub issue forms, GitLab CI inputs), reached through a `$ref`, with `else`s and absence tests."""

from __future__ import annotations

import itertools
import json

import httpx
import jsonschema
import pytest

from bench.harness.server_process import MODEL
from grammar import GrammarSpec
from grammar.engines.llguidance.matcher import LLGuidanceHandle
from grammar.rewrites.conditionals import allof_conditionals, discriminator, lower_conditionals, narrow_by_branches
from grammar.validation.fidelity import ENFORCED, LLGUIDANCE, XGRAMMAR, routed_schema_fidelity
from tests.grammar.validation.test_llguidance_fidelity import writes

PAYMENT = {
    "type": "object",
    "properties": {
        "method": {"type": "string", "enum": ["card", "bank", "cash"]},
        "card_number": {"type": "string", "pattern": "^[0-9]{4}$"},
        "iban": {"type": "string"},
    },
    "required": ["method"],
    "if": {"properties": {"method": {"const": "card"}}},
    "then": {"required": ["card_number"]},
    "else": {"required": ["iban"]},
}


def instances():
    """Objects over the schema's names: every method (or none) with every subset of the others."""
    values = {"card_number": "1234", "iban": "DE00"}
    for method in ("card", "bank", "cash", None):
        for k in range(3):
            for names in itertools.combinations(values, k):
                obj = {n: values[n] for n in names}
                if method is not None:
                    obj["method"] = method
                yield obj


@pytest.mark.parametrize("optional,test_requires", [(False, False), (True, False), (True, True)])
def test_lowering_accepts_exactly_what_the_original_accepts(optional, test_requires):
    schema = json.loads(json.dumps(PAYMENT))
    if optional:
        schema["required"] = []
    if test_requires:
        schema["if"]["required"] = ["method"]
    lowered = lower_conditionals(schema)
    assert "if" not in lowered and "anyOf" in lowered
    original, rewritten = jsonschema.Draft202012Validator(schema), jsonschema.Draft202012Validator(lowered)
    verdicts = [(obj, original.is_valid(obj), rewritten.is_valid(obj)) for obj in instances()]
    assert all(a == b for _, a, b in verdicts), [v for v in verdicts if v[1] != v[2]]
    assert any(a for _, a, _ in verdicts) and not all(a for _, a, _ in verdicts)


@pytest.mark.parametrize(
    "node",
    [
        {
            "properties": {"x": {"type": "string"}},
            "if": {"properties": {"x": {"const": "a"}}},
            "then": {},
        },  # x unbounded
        {
            "properties": {"x": {"enum": [1, 2]}},
            "if": {"properties": {"x": {"minimum": 2}}},
            "then": {},
        },  # not a listing
        {
            "properties": {"x": {"enum": [1]}, "y": {"enum": [1]}},
            "if": {"properties": {"x": {"const": 1}, "y": {"const": 1}}},
            "then": {},
        },  # two properties tested
        {"properties": {"x": {"enum": [1]}}, "anyOf": [{}], "if": {"properties": {"x": {"const": 1}}}},  # beside anyOf
    ],
)
def test_other_conditionals_are_left_alone(node):
    assert discriminator(node) is None
    assert lower_conditionals(node) == node


def test_fidelity_routes_a_discriminator_to_llguidance_and_strict_accepts_it():
    report = routed_schema_fidelity(PAYMENT, strict=True)
    assert report.engine == LLGUIDANCE
    assert report.refused_in_strict == ()
    verdicts = {(k.pointer, k.keyword): (k.status, k.engine) for k in report.keywords}
    for pointer in ("/if", "/then", "/else"):
        assert verdicts[(pointer, pointer[1:])] == (ENFORCED, LLGUIDANCE)
    # a branch's own keywords are classified under their pointers too
    assert (("/then/required", "required")) in verdicts


def test_an_unbounded_condition_is_still_refused_in_strict_mode():
    schema = {**PAYMENT, "properties": {**PAYMENT["properties"], "method": {"type": "string"}}}
    report = routed_schema_fidelity(schema, strict=True)
    assert report.engine == XGRAMMAR
    assert {k.pointer for k in report.refused_in_strict} >= {"/if", "/then", "/else"}


def test_the_llguidance_grammar_refuses_what_the_branch_forbids(service, tokenizer):
    handle = service.compile(GrammarSpec("json_schema", PAYMENT, True))
    assert isinstance(handle, LLGuidanceHandle)
    assert writes(handle, tokenizer, '{"method":"card","card_number":"1234"}')
    assert writes(handle, tokenizer, '{"method":"bank","iban":"DE00"}')
    assert not writes(handle, tokenizer, '{"method":"card","iban":"DE00"}')  # then: card_number missing
    assert not writes(handle, tokenizer, '{"method":"cash","card_number":"1234"}')  # else: iban missing


def strict_answers(server, name: str, schema: dict, asks: list[str], max_tokens: int) -> list:
    """The real model's strict answers to `asks` (greedy), each checked: it stopped by itself,
    validates with jsonschema, and the server says so."""
    rf = {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}
    answers = []
    with httpx.Client(base_url=server.url, timeout=180) as http:
        for ask in asks:
            resp = http.post(
                "/v1/chat/completions",
                json={
                    "model": MODEL,
                    "messages": [{"role": "user", "content": ask}],
                    "max_tokens": max_tokens,
                    "temperature": 0,
                    "response_format": rf,
                },
            )
            assert resp.status_code == 200, resp.text
            choice = resp.json()["choices"][0]
            assert choice["finish_reason"] == "stop", choice
            answers.append(json.loads(choice["message"]["content"]))
            jsonschema.validate(answers[-1], schema)
            assert choice["jumpgate"]["schema_valid"] is True
    return answers


@pytest.mark.e2e
def test_the_real_model_answers_a_conditional_schema_validly(jumpgate_server):
    strict_answers(
        jumpgate_server,
        "payment",
        PAYMENT,
        ["Pay by card, as JSON.", "Pay by bank transfer, as JSON.", "Pay in cash, as JSON."],
        64,
    )


# GitHub issue forms' shape: the discriminator listed through a $ref, one conditional per kind,
# each `then` a closed object that declares names the enclosing object does not
FORM_ITEM = {
    "type": "object",
    "$defs": {"kind": {"type": "string", "enum": ["markdown", "input", "dropdown"]}},
    "properties": {"type": {"$ref": "#/$defs/kind"}},
    "required": ["type"],
    "allOf": [
        {
            "$comment": "a markdown item has a value",
            "if": {"properties": {"type": {"const": "markdown"}}},
            "then": {
                "properties": {"type": {}, "value": {"type": "string"}},
                "required": ["value"],
                "additionalProperties": False,
            },
        },
        {
            "if": {"properties": {"type": {"const": "input"}}},
            "then": {
                "properties": {"type": {}, "label": {"type": "string"}, "placeholder": {"type": "string"}},
                "required": ["label"],
                "additionalProperties": False,
            },
        },
        {
            "if": {"properties": {"type": {"const": "dropdown"}}},
            "then": {
                "properties": {
                    "type": {},
                    "label": {"type": "string"},
                    "options": {"type": "array", "items": {"type": "string"}, "minItems": 1},
                },
                "required": ["label", "options"],
                "additionalProperties": False,
            },
        },
    ],
}

# GitLab CI inputs' shape: `default`'s type follows `type`, and an absent `type` means string
INPUT = {
    "type": "object",
    "properties": {"type": {"enum": ["string", "number", "boolean"]}, "default": {}},
    "allOf": [
        {
            "if": {"properties": {"type": {"enum": ["string"]}}, "required": ["type"]},
            "then": {"properties": {"default": {"type": "string"}}},
        },
        {
            "if": {"properties": {"type": {"enum": ["number"]}}, "required": ["type"]},
            "then": {"properties": {"default": {"type": "number"}}},
            "else": {"not": {"required": ["step"]}},
        },
        {"if": {"not": {"required": ["type"]}}, "then": {"properties": {"default": {"type": "string"}}}},
    ],
}


def _objects(names_values: dict, discriminator_values: list) -> list[dict]:
    found = []
    for kind in discriminator_values:
        for k in range(len(names_values) + 1):
            for names in itertools.combinations(names_values, k):
                for values in itertools.product(*(names_values[n] for n in names)):
                    obj = dict(zip(names, values))
                    if kind is not None:
                        obj["type"] = kind
                    found.append(obj)
    return found


@pytest.mark.parametrize(
    "schema,instances",
    [
        (
            FORM_ITEM,
            _objects(
                {"value": ["v"], "label": ["l"], "placeholder": ["p"], "options": [["a"], []]},
                ["markdown", "input", "dropdown", "other", None],
            ),
        ),
        (INPUT, _objects({"default": ["s", 1, True], "step": [1]}, ["string", "number", "boolean", None])),
    ],
    ids=["form_item", "gitlab_input"],
)
def test_an_allof_of_conditionals_lowers_to_an_anyof_that_accepts_exactly_the_same(schema, instances):
    lowered = lower_conditionals(schema)
    assert "anyOf" in lowered and "if" not in json.dumps(lowered.get("allOf", []))
    original, rewritten = jsonschema.Draft202012Validator(schema), jsonschema.Draft202012Validator(lowered)
    verdicts = [(obj, original.is_valid(obj), rewritten.is_valid(obj)) for obj in instances]
    assert all(a == b for _, a, b in verdicts), [v for v in verdicts if v[1] != v[2]]
    assert 3 <= sum(a for _, a, _ in verdicts) < len(verdicts) - 3  # both verdicts are common


def test_the_names_only_a_then_declares_join_the_open_object():
    lowered = lower_conditionals(FORM_ITEM)
    assert list(lowered["properties"]) == ["type", "value", "label", "placeholder", "options"]
    assert all(lowered["properties"][n] == {} for n in ("value", "label", "placeholder", "options"))
    closed = {**FORM_ITEM, "additionalProperties": False}
    assert list(lower_conditionals(closed)["properties"]) == ["type"]  # a closed object keeps its names


@pytest.mark.parametrize(
    "node",
    [
        {
            "properties": {"x": {"enum": [1, 2]}, "y": {"enum": [1, 2]}},  # two properties tested
            "allOf": [
                {"if": {"properties": {"x": {"const": 1}}}, "then": {}},
                {"if": {"properties": {"y": {"const": 1}}}, "then": {}},
            ],
        },
        {
            "properties": {"x": {"type": "string"}},  # x unbounded
            "allOf": [{"if": {"properties": {"x": {"const": "a"}}}, "then": {"required": ["z"]}}],
        },
        {
            "properties": {"x": {"enum": [1, 2]}},  # one conditional is not on a discriminator
            "allOf": [
                {"if": {"properties": {"x": {"const": 1}}}, "then": {}},
                {"if": {"minProperties": 2}, "then": {}},
            ],
        },
        {
            "properties": {"x": {"enum": [1, 2]}},
            "anyOf": [{}],  # beside anyOf
            "allOf": [{"if": {"properties": {"x": {"const": 1}}}, "then": {}}],
        },
    ],
)
def test_other_allofs_of_conditionals_are_left_alone(node):
    assert allof_conditionals(node) is None
    assert lower_conditionals(node) == node


def test_fidelity_routes_an_allof_of_conditionals_to_llguidance():
    report = routed_schema_fidelity(FORM_ITEM, strict=True)
    assert report.engine == LLGUIDANCE and report.refused_in_strict == ()
    verdicts = {(k.pointer, k.keyword): (k.status, k.engine) for k in report.keywords}
    for i in range(3):
        for keyword in ("if", "then"):
            assert verdicts[(f"/allOf/{i}/{keyword}", keyword)] == (ENFORCED, LLGUIDANCE)
    assert ("/allOf/2/then/properties/options/minItems", "minItems") in verdicts  # the bodies are walked
    # the same allOf with its discriminator unbounded is still refused, naming the conditionals
    unbounded = {**FORM_ITEM, "properties": {"type": {"type": "string"}}}
    refused = {k.pointer for k in routed_schema_fidelity(unbounded, strict=True).refused_in_strict}
    assert {"/allOf/0/if", "/allOf/0/then"} <= refused or "/allOf" in refused


def test_the_llguidance_grammar_follows_each_kind(service, tokenizer):
    handle = service.compile(GrammarSpec("json_schema", FORM_ITEM, True))
    assert isinstance(handle, LLGuidanceHandle)
    assert writes(handle, tokenizer, '{"type":"markdown","value":"Thanks!"}')
    assert writes(handle, tokenizer, '{"type":"input","label":"Name","placeholder":"Ada"}')
    assert writes(handle, tokenizer, '{"type":"dropdown","label":"OS","options":["linux"]}')
    assert not writes(handle, tokenizer, '{"type":"markdown","label":"Name"}')  # value missing, label foreign
    assert not writes(handle, tokenizer, '{"type":"input","value":"x","label":"Name"}')  # value foreign
    assert not writes(handle, tokenizer, '{"type":"dropdown","label":"OS","options":[]}')  # minItems
    assert not writes(handle, tokenizer, '{"type":"dropdown","label":"OS"}')  # options missing


@pytest.mark.e2e
def test_the_real_model_answers_an_allof_of_conditionals_validly(jumpgate_server):
    answers = strict_answers(
        jumpgate_server,
        "form_item",
        FORM_ITEM,
        [
            "A dropdown form item asking for the operating system, as JSON.",
            "A text input form item asking for a name, as JSON.",
            "A markdown form item thanking the reader, as JSON.",
        ],
        96,
    )
    assert len({a["type"] for a in answers}) >= 2  # the answers take different branches


# -- a property both branches declare, narrowed for xgrammar's mask (narrow_by_branches) ----------

# github-actions' shape: `outputs` is `{}` beside the conditional, whose branches say what it is
ACTION = {
    "type": "object",
    "properties": {"runs": {"type": "object", "properties": {"using": {"type": "string"}}}, "outputs": {}},
    "required": ["runs"],
    "additionalProperties": False,
    "if": {"properties": {"runs": {"properties": {"using": {"const": "composite"}}}}},
    "then": {"properties": {"outputs": {"$ref": "#/$defs/composite"}}},
    "else": {"properties": {"outputs": {"type": "object", "additionalProperties": {"type": "string"}}}},
    "$defs": {"composite": {"type": "object", "additionalProperties": {"type": "object", "required": ["value"]}}},
}


def test_a_property_both_branches_declare_is_narrowed_to_their_any_of():
    narrowed = narrow_by_branches(ACTION)["properties"]["outputs"]
    assert narrowed == {"anyOf": [{"$ref": "#/$defs/composite"}, ACTION["else"]["properties"]["outputs"]]}
    # sound: whatever the conditional accepts, the narrowed object (conditional dropped) accepts too
    loose = {k: v for k, v in narrow_by_branches(ACTION).items() if k not in ("if", "then", "else")}
    for using, outputs in itertools.product(["composite", "node20"], [{}, {"a": "x"}, {"a": {"value": 1}}, 5, "x"]):
        value = {"runs": {"using": using}, "outputs": outputs}
        if jsonschema.Draft202012Validator(ACTION).is_valid(value):
            assert jsonschema.Draft202012Validator(loose).is_valid(value), value


@pytest.mark.parametrize(
    "node",
    [
        {**ACTION, "else": None},  # no else: anything goes there
        {**ACTION, "properties": {**ACTION["properties"], "outputs": {"type": "object"}}},  # said beside
        {**ACTION, "then": {"required": ["outputs"]}},  # only one branch declares it
    ],
)
def test_other_properties_are_not_narrowed(node):
    node = {k: v for k, v in node.items() if v is not None}
    assert narrow_by_branches(node)["properties"]["outputs"] == node["properties"]["outputs"]


def test_xgrammars_mask_keeps_a_scalar_out_of_the_narrowed_property(service, tokenizer):
    handle = service.compile(GrammarSpec.json_schema(ACTION))
    assert handle.fidelity.engine == XGRAMMAR

    def writes_all(text: str) -> bool:
        matcher = handle.new_matcher()
        return all(matcher.accept(t) for t in tokenizer.encode(text, add_special_tokens=False))

    assert writes_all('{"runs":{"using":"node20"},"outputs":{"a":"x"}}')
    assert not writes_all('{"runs":{"using":"node20"},"outputs":5')  # before: any JSON value
