"""Schema fidelity through a real `jumpgate serve` (SmolLM2-135M on CPU, the session's server):

- a string with `pattern` and `maxLength` (xgrammar drops the length) is compiled by llguidance, so
  strict mode answers it, and every value the model writes respects both keywords even when asked
  for a long word;
- a keyword no mask enforces (`uniqueItems` over pattern-bound strings, which a repeat could not
  grow out of) is answered in strict mode by check-and-roll-back (tests/grammar/checks/test_rollback_e2e.py), and
  one nothing enforces (a `format` jsonschema cannot check) refused with the keyword's pointer, while
  `uniqueItems` over free strings is answered, unique (Jumpgate's value check), and so is a pydantic
  set of frozen models (`uniqueItems` over objects of scalar properties);
- with best effort the model's real output comes back with a verdict that agrees with jsonschema's,
  on whole and streamed responses;
- each keyword issue #16 names, answered in strict mode on a prompt that leads the model to break it
  (the control: the same prompt under the schema without the keyword, whose answer the whole schema
  refuses), with /v1/schemas/check naming the engine that enforces it and the strict answer ending
  by itself (`stop`) and validating with jsonschema (formats checked):
  - `multipleOf: 0.25` on a `number` (llguidance), asked for a price of 19.99;
  - `if`/`then`/`else` on a discriminator (lowered to anyOf, llguidance: a book has an author and no
    director, a movie the other way round), asked about a movie made from a novel;
  - `required: ["sku"]` beside an `anyOf` of two `required` alternatives in array items (the issue's
    shape; llguidance), asked for an item whose SKU is unknown;
  - `dependentRequired` (the value check), asked to pay by card without a billing address;
  - `uniqueItems` over free strings (the value check), asked for the same word three times;
  - a `pattern` that opens with a negative lookahead, `^(?!admin)[a-z_]{3,16}$` (llguidance's
    regex intersection, grammar/rewrites/string_algebra.py), asked for the username admin_root;
  - a string's `not: {const: "latest"}` (a regex complement there), asked to tag an image latest;
- strict answers of the llguidance-compiled schemas above at the smallest budget their schema allows
  (the one a budget below is refused with) and a little more are complete and valid, closed by the
  budget guard, where the same requests without strict mode are cut.
"""

from __future__ import annotations

import json
import re

import httpx
import jsonschema
import pytest
from pydantic import BaseModel, Field

from bench.harness.server_process import MODEL, parse_metrics
from tests.conftest import openai_client

pytestmark = pytest.mark.e2e

WORD = {
    "type": "object",
    "properties": {"word": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 5}},
    "required": ["word"],
    "additionalProperties": False,
}
ASK = [{"role": "user", "content": "Give me one very long English word, like 'extraordinary', as JSON."}]


@pytest.fixture(scope="module")
def http(jumpgate_server):
    with httpx.Client(base_url=jumpgate_server.url, timeout=180) as client:
        yield client


def body(**fields):
    out = {
        "model": MODEL,
        "messages": ASK,
        "temperature": 0,
        "max_tokens": 24,
        "response_format": {"type": "json_schema", "json_schema": {"name": "word", "schema": WORD}},
    }
    out.update(fields)
    return out


def jsonschema_verdict(text: str) -> bool:
    try:
        value = json.loads(text)
    except ValueError:
        return False
    return jsonschema.Draft202012Validator(WORD).is_valid(value)


def test_strict_pattern_with_max_length_answers_within_the_length(http):
    rf = {"type": "json_schema", "json_schema": {"name": "word", "schema": WORD, "strict": True}}
    resp = http.post("/v1/chat/completions", json=body(response_format=rf, n=3, temperature=1.0, seed=7))
    assert resp.status_code == 200, resp.text
    # the slowest choice's mean decode step, which bench/suites/structured/fidelity.py reports per schema
    assert 0 < float(resp.headers["x-jumpgate-decode-ms-per-token"]) < 60_000
    for choice in resp.json()["choices"]:
        word = json.loads(choice["message"]["content"])["word"]
        assert re.fullmatch(r"[a-z]{1,5}", word), word
        assert choice["jumpgate"] == {**choice["jumpgate"], "schema_mode": "strict", "schema_valid": True}


def test_schema_check_says_llguidance_enforces_the_length(http):
    check = http.post("/v1/schemas/check", json={"schema": WORD}).json()
    assert check["strict_accepted"] is True
    assert check["fidelity"]["engine"] == "llguidance"
    length = [k for k in check["fidelity"]["keywords"] if k["pointer"] == "/properties/word/maxLength"]
    assert [(k["status"], k["engine"]) for k in length] == [("enforced", "llguidance")]


def test_strict_takes_a_keyword_no_engine_masks_by_check_and_rollback(http):
    schema = {
        "type": "object",
        "properties": {"words": {"type": "array", "items": WORD["properties"]["word"], "uniqueItems": True}},
        "required": ["words"],
    }
    check = http.post("/v1/schemas/check", json={"schema": schema}).json()
    assert check["strict_accepted"] is True
    # llguidance masks the words' pattern and maxLength; only uniqueItems is left to the rewrites
    assert check["fidelity"]["engine"] == "llguidance"
    unique = [k for k in check["fidelity"]["keywords"] if k["pointer"] == "/properties/words/uniqueItems"]
    assert [(k["status"], k["engine"]) for k in unique] == [("enforced", "check_and_rollback")]
    rf = {"type": "json_schema", "json_schema": {"name": "words", "schema": schema}}
    resp = http.post("/v1/chat/completions", json=body(response_format=rf, max_tokens=64))
    assert resp.status_code == 200, resp.text
    choice = resp.json()["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["jumpgate"]["schema_valid"] is True
    jsonschema.Draft202012Validator(schema).validate(json.loads(choice["message"]["content"]))


def test_strict_refuses_a_keyword_nothing_enforces(http):
    schema = {"type": "object", "properties": {"phone": {"type": "string", "format": "phone"}}, "required": ["phone"]}
    rf = {"type": "json_schema", "json_schema": {"name": "contact", "schema": schema}}
    resp = http.post("/v1/chat/completions", json=body(response_format=rf))
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["code"] == "schema_not_enforceable"
    assert error["param"] == "response_format.json_schema.schema"
    assert "'format' at '/properties/phone/format'" in error["message"]
    check = http.post("/v1/schemas/check", json={"schema": schema}).json()
    assert check["strict_accepted"] is False
    assert "'format' at '/properties/phone/format'" in check["strict_refusal"]


def test_strict_answers_unique_items_the_value_check_enforces(http):
    schema = {
        "type": "object",
        "properties": {"fruits": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}},
        "required": ["fruits"],
    }
    rf = {"type": "json_schema", "json_schema": {"name": "fruits", "schema": schema}}
    ask = [
        {"role": "system", "content": "You are a JSON API. Reply with one compact JSON value only."},
        {"role": "user", "content": "List the word apple three times: apple, apple, apple."},
    ]
    resp = http.post("/v1/chat/completions", json=body(response_format=rf, messages=ask, max_tokens=64))
    assert resp.status_code == 200, resp.text
    choice = resp.json()["choices"][0]
    fruits = json.loads(choice["message"]["content"])["fruits"]
    assert len(set(fruits)) == len(fruits), fruits  # the model repeats "apple" without the check
    assert choice["jumpgate"]["schema_valid"] is True


class Basket(BaseModel):
    fruits: set[str] = Field(min_length=2)  # JSON schema: an array with uniqueItems and minItems


def test_pydantic_sets_parse_in_strict_mode(jumpgate_server):
    client = openai_client(jumpgate_server)
    completion = client.chat.completions.parse(
        # room for the model's own end: with fp32 weights it lists on (unique, as the check makes it)
        # until ~100 tokens (a tighter budget: the next test)
        model=MODEL,
        response_format=Basket,
        temperature=0,
        max_tokens=200,
        messages=[
            {"role": "system", "content": "You are a JSON API. Reply with one compact JSON value only."},
            {"role": "user", "content": "Put an apple, a pear and a plum in the basket."},
        ],
    )
    basket = completion.choices[0].message.parsed  # before the value check: a 400 (uniqueItems)
    assert isinstance(basket, Basket) and len(basket.fruits) >= 2
    text = completion.choices[0].message.content
    fruits = json.loads(text)["fruits"]
    assert len(set(fruits)) == len(fruits), text  # a set would hide a repeat: check the JSON itself


def test_parse_takes_a_value_the_budget_closed(jumpgate_server):
    """The model would list fruit for ~100 tokens; 24 make strict closing finish the value. It ends
    `stop`, so parse() returns it (it raises LengthFinishReasonError on `length`), and the choice
    says the budget closed it."""
    client = openai_client(jumpgate_server)
    completion = client.chat.completions.parse(
        model=MODEL,
        response_format=Basket,
        temperature=0,
        max_tokens=24,
        messages=[
            {"role": "system", "content": "You are a JSON API. Reply with one compact JSON value only."},
            {"role": "user", "content": "Put an apple, a pear and a plum in the basket."},
        ],
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "stop" and completion.usage.completion_tokens <= 24
    assert isinstance(choice.message.parsed, Basket) and len(choice.message.parsed.fruits) >= 2
    assert choice.model_extra["jumpgate"]["closed_at_budget"] is True, choice.message.content
    assert choice.model_extra["jumpgate"]["schema_valid"] is True


class Person(BaseModel, frozen=True):
    name: str
    age: int


class People(BaseModel):
    people: set[Person] = Field(min_length=2, max_length=3)  # uniqueItems over objects


def test_pydantic_sets_of_frozen_models_parse_in_strict_mode(jumpgate_server):
    client = openai_client(jumpgate_server)
    completion = client.chat.completions.parse(
        model=MODEL,
        response_format=People,
        temperature=0,
        max_tokens=200,
        messages=[
            {"role": "system", "content": "You are a JSON API. Reply with one compact JSON value only."},
            {"role": "user", "content": "Bob is 30. Bob is 30. Bob is 30. List the people."},
        ],
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "stop", choice  # before the value check steered objects: a 400 (uniqueItems)
    assert isinstance(choice.message.parsed, People) and len(choice.message.parsed.people) >= 2
    text = choice.message.content
    people = json.loads(text)["people"]
    assert len({json.dumps(p, sort_keys=True) for p in people}) == len(people), text  # the JSON itself, not the set
    jsonschema.validate(json.loads(text), People.model_json_schema())


def test_best_effort_output_carries_a_verdict_that_agrees_with_jsonschema(http):
    resp = http.post("/v1/chat/completions", json=body(schema_mode="best_effort", n=2, temperature=1.0, seed=3))
    assert resp.status_code == 200, resp.text
    choices = resp.json()["choices"]
    verdicts = []
    for choice in choices:
        content, verdict = choice["message"]["content"], choice["jumpgate"]
        assert verdict["schema_mode"] == "best_effort"
        assert verdict["schema_valid"] is jsonschema_verdict(content), (content, verdict)
        assert verdict["schema_valid"] is (verdict["schema_errors"] == [])
        verdicts.append(verdict["schema_valid"])
    assert resp.headers["x-jumpgate-schema-valid"] == ("true" if all(verdicts) else "false")
    if not all(verdicts):
        metrics = parse_metrics(http.get("/metrics").text)
        assert metrics.get('jumpgate_structured_output_invalid_total{mode="best_effort",reason="schema"}', 0) >= 1


def test_streamed_best_effort_verdict_comes_with_the_final_chunk(http):
    with http.stream("POST", "/v1/chat/completions", json=body(schema_mode="best_effort", stream=True)) as resp:
        assert resp.status_code == 200
        events = [
            json.loads(line[6:]) for line in resp.iter_lines() if line.startswith("data: ") and line != "data: [DONE]"
        ]
    content = "".join(c["delta"].get("content", "") for e in events for c in e["choices"])
    finals = [c for e in events for c in e["choices"] if c["finish_reason"]]
    assert len(finals) == 1
    assert finals[0]["jumpgate"]["schema_valid"] is jsonschema_verdict(content), (content, finals[0])


# ------------------------------------------------------------------ each keyword of the issue, enforced

SYSTEM = "You are a JSON API. Reply with one compact JSON value only."


def closed(properties: dict, required: list[str], **more) -> dict:
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False, **more}


MEDIA = {"kind": {"enum": ["book", "movie"]}, "author": {"type": "string"}, "director": {"type": "string"}}
# bounded strings and items let the model end by itself within strict_answer's 96 tokens (`stop`): the
# keyword is then shown enforced on the model's own value, not on one the closing guard completed
SHORT = {"type": "string", "maxLength": 16}
LINE = {"name": SHORT, "sku": SHORT, "id": SHORT}
PAYMENT = {"name": {"type": "string"}, "credit_card": {"type": "string"}, "billing_address": {"type": "string"}}


def order(**item_keywords) -> dict:
    items = {"type": "object", "properties": LINE, **item_keywords}
    return closed({"items": {"type": "array", "minItems": 1, "maxItems": 2, "items": items}}, ["items"])


# name -> (schema, the same schema without the keyword (the control), prompt, {pointer: engine});
# each prompt leads the model (greedy, the default weights) to break the keyword under the control
ENFORCED_KEYWORDS = {
    "multipleOf_number": (
        closed({"price": {"type": "number", "multipleOf": 0.25}}, ["price"]),
        closed({"price": {"type": "number"}}, ["price"]),
        "The book costs 19.99 dollars. What is its price?",  # the control writes 19.99
        {"/properties/price/multipleOf": "llguidance"},
    ),
    "if_then_else_discriminator": (  # a book has an author and no director, a movie the other way round
        {
            **closed(MEDIA, ["kind"]),
            "if": {"properties": {"kind": {"const": "book"}}},
            "then": {"required": ["author"], "properties": {"director": False}},
            "else": {"required": ["director"], "properties": {"author": False}},
        },
        closed(MEDIA, ["kind"]),
        "The movie Jaws (1975), from Peter Benchley's novel.",  # the control: a book with a director
        {"/if": "llguidance", "/then": "llguidance", "/else": "llguidance"},
    ),
    "required_beside_anyOf": (  # the issue's shape: a required name beside an anyOf of two required ones
        order(required=["sku"], anyOf=[{"required": ["name"]}, {"required": ["id"]}]),
        order(),
        "Add apples to the order. We do not know their SKU.",  # the control leaves the sku out
        # the keywords beside the anyOf merge into its branches, which xgrammar masks (grammar/rewrites/all_of.py)
        {
            "/properties/items/items/anyOf": "xgrammar",
            "/properties/items/items/anyOf/0/required": "xgrammar",
            "/properties/items/items/anyOf/1/required": "xgrammar",
        },
    ),
    "dependentRequired": (
        {
            "type": "object",
            "properties": PAYMENT,
            "required": ["name"],
            "dependentRequired": {"credit_card": ["billing_address"]},
        },
        {"type": "object", "properties": PAYMENT, "required": ["name"]},
        "Alice pays with credit card 4111 1111 1111 1111.",  # the control gives no billing address
        {"/dependentRequired": "value_check"},
    ),
    # the same rule written as a conditional: `if` the card is there, `then` the address is
    "if_then_required": (
        {
            "type": "object",
            "properties": PAYMENT,
            "required": ["name"],
            "if": {"required": ["credit_card"]},
            "then": {"required": ["billing_address"]},
        },
        {"type": "object", "properties": PAYMENT, "required": ["name"]},
        "Alice pays with credit card 4111 1111 1111 1111.",
        {"/if": "value_check", "/then": "value_check"},
    ),
    # GitHub workflows' trigger shape: a `not` that says two names may not both be there
    "not_both_names": (
        {**closed(MEDIA, ["kind"]), "not": {"type": "object", "required": ["author", "director"]}},
        closed(MEDIA, ["kind"]),
        "The movie Jaws (1975), directed by Steven Spielberg, from the novel by Peter Benchley.",
        {"/not": "llguidance"},
    ),
    # a pattern that opens with a lookahead (grammar/rewrites/string_algebra.py: an intersection in llguidance's Lark)
    "lookahead_pattern": (
        closed({"user": {"type": "string", "pattern": "^(?!admin)[a-z_]{3,16}$"}}, ["user"]),
        closed({"user": {"type": "string", "pattern": "^[a-z_]{3,16}$"}}, ["user"]),
        "Create an account for the administrator; their username is admin_root.",  # the control: admin_root
        {"/properties/user/pattern": "llguidance"},
    ),
    # a string's `not` of a listed string (a regex complement in llguidance's Lark)
    "not_listed_string": (
        closed({"tag": {"type": "string", "not": {"const": "latest"}}}, ["tag"]),
        closed({"tag": {"type": "string"}}, ["tag"]),
        "Tag the image as latest.",  # the control writes latest
        {"/properties/tag/not": "llguidance"},
    ),
    "uniqueItems_strings": (
        closed(
            {"fruits": {"type": "array", "items": {"type": "string"}, "uniqueItems": True, "maxItems": 3}}, ["fruits"]
        ),
        closed({"fruits": {"type": "array", "items": {"type": "string"}, "maxItems": 3}}, ["fruits"]),
        "List the word apple three times: apple, apple, apple.",  # the control repeats apple
        {"/properties/fruits/uniqueItems": "value_check"},
    ),
}


def strict_answer(http, schema: dict, prompt: str) -> dict:
    rf = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}}
    resp = http.post(
        "/v1/chat/completions",
        json={
            "model": MODEL,
            "temperature": 0,
            "max_tokens": 96,
            "response_format": rf,
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}],
        },
    )
    assert resp.status_code == 200, resp.text
    return resp.json()["choices"][0]


def validator(schema: dict) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())


@pytest.mark.parametrize("name", list(ENFORCED_KEYWORDS))
def test_schema_check_reports_the_keyword_enforced_by_its_engine(http, name):
    schema, _, _, engines = ENFORCED_KEYWORDS[name]
    check = http.post("/v1/schemas/check", json={"schema": schema}).json()
    assert check["strict_accepted"] is True, check["strict_refusal"]
    got = {
        k["pointer"]: (k["status"], k.get("engine", "xgrammar"))
        for k in check["fidelity"]["keywords"]
        if k["pointer"].endswith("/" + k["keyword"])
    }  # not the duplicate-key entry of an object at /then
    assert {p: got.get(p) for p in engines} == {p: ("enforced", e) for p, e in engines.items()}


@pytest.mark.parametrize("name", list(ENFORCED_KEYWORDS))
def test_without_the_keyword_the_model_breaks_it(http, name):
    """The control: the prompt really leads the model to break the keyword, so the next test can fail."""
    schema, control, prompt, _ = ENFORCED_KEYWORDS[name]
    choice = strict_answer(http, control, prompt)
    value = json.loads(choice["message"]["content"])
    assert not validator(schema).is_valid(value), choice["message"]["content"]


@pytest.mark.parametrize("name", list(ENFORCED_KEYWORDS))
def test_strict_answers_the_keyword_and_the_answer_validates(http, name):
    schema, _, prompt, _ = ENFORCED_KEYWORDS[name]
    choice = strict_answer(http, schema, prompt)
    text = choice["message"]["content"]
    assert choice["finish_reason"] == "stop", (choice["finish_reason"], text)
    validator(schema).validate(json.loads(text))
    assert choice["jumpgate"] == {**choice["jumpgate"], "schema_mode": "strict", "schema_valid": True}


# ------------------------------------------------------------------ llguidance grammars close on budget

LLGUIDANCE_ROUTED = [
    name for name, (_, _, _, engines) in ENFORCED_KEYWORDS.items() if set(engines.values()) == {"llguidance"}
]


def answer_within(http, schema: dict, prompt: str, max_tokens: int, strict: bool = True):
    rf = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": strict}}
    return http.post(
        "/v1/chat/completions",
        json={
            "model": MODEL,
            "temperature": 0,
            "max_tokens": max_tokens,
            "response_format": rf,
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}],
        },
    )


@pytest.mark.parametrize("name", LLGUIDANCE_ROUTED)
def test_strict_llguidance_answers_complete_within_the_smallest_budget(http, name):
    schema, _, prompt, _ = ENFORCED_KEYWORDS[name]
    refused = answer_within(http, schema, prompt, 1)  # below the smallest value: refused, naming it
    assert refused.status_code == 400, refused.text
    need = int(re.search(r"needs (\d+) tokens", refused.json()["error"]["message"]).group(1))
    assert answer_within(http, schema, prompt, need - 1).status_code == 400
    for budget in (need, need + 3):
        resp = answer_within(http, schema, prompt, budget)
        assert resp.status_code == 200, resp.text
        choice, usage = resp.json()["choices"][0], resp.json()["usage"]
        text = choice["message"]["content"]
        assert usage["completion_tokens"] <= budget
        validator(schema).validate(json.loads(text))  # complete and valid, not cut
        assert choice["jumpgate"] == {**choice["jumpgate"], "schema_mode": "strict", "schema_valid": True}
        assert choice["finish_reason"] == "stop", text  # whole values end `stop`, however they closed
        if budget == need:  # the model's own answer is longer: the guard closed it, and says so
            assert choice["jumpgate"]["closed_at_budget"] is True, text
    # the control: the same request without strict mode runs into the budget mid-value
    loose = answer_within(http, schema, prompt, need, strict=False).json()["choices"][0]
    assert loose["finish_reason"] == "length" and loose["jumpgate"]["schema_valid"] is False, loose
