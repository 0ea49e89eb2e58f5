"""vLLM's and SGLang's request forms of a constraint (issue #46 item 4): `structured_outputs`, the
`guided_*` fields, `response_format: structural_tag`, and `chat_template_kwargs`. Bad forms are
refused by the gateway over the scripted engine; good ones run on the real server and the
official client, and the output keeps the constraint."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
from transformers import AutoTokenizer

from gateway.pipeline.prompt import PromptRenderer
from gateway.protocol import UserMessage
from tests.conftest import chat, openai_client

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
ANSWER_TAG = {
    "type": "structural_tag",
    "format": {
        "type": "sequence",
        "elements": [
            {"type": "const_string", "value": "Answer: "},
            {"type": "json_schema", "json_schema": PERSON},
        ],
    },
}


def error_of(response, status=400):
    assert response.status_code == status, response.text
    return response.json()["error"]


@pytest.mark.parametrize(
    "body, param, code",
    [
        ({"guided_json": "{not json"}, "guided_json", None),
        ({"guided_json": "[1, 2]"}, "guided_json", None),
        ({"guided_choice": []}, "guided_choice", "invalid_choice"),
        ({"guided_choice": ["yes", ""]}, "guided_choice", "invalid_choice"),
        ({"structured_outputs": {"choice": []}}, "structured_outputs.choice", "invalid_choice"),
        ({"guided_regex": ""}, "guided_regex", None),
        ({"guided_regex": "(unclosed"}, "guided_regex", "invalid_regex"),
        ({"structured_outputs": {"json": {"type": "strng"}}}, "structured_outputs.json", "invalid_schema"),
        ({"guided_whitespace_pattern": r"[ ]?"}, "guided_whitespace_pattern", "unsupported"),
        ({"structured_outputs": {"whitespace_pattern": " "}}, "structured_outputs.whitespace_pattern", "unsupported"),
        ({"response_format": {"type": "structural_tag"}}, "response_format", None),
        (
            {"response_format": {"type": "structural_tag", "format": {"type": "no_such_format"}}},
            "response_format",
            "invalid_structural_tag",
        ),
        ({"structured_outputs": {"structural_tag": "{oops"}}, "structured_outputs.structural_tag", None),
        ({"chat_template_kwargs": {"add_generation_prompt": False}}, "chat_template_kwargs", None),
        ({"chat_template_kwargs": {"not a name": 1}}, "chat_template_kwargs", None),
    ],
)
def test_a_bad_form_is_refused_at_its_own_field(gateway_client, body, param, code):
    err = error_of(chat(gateway_client(), **body))
    assert err["param"] == param, err
    if code is not None:
        assert err["code"] == code, err


def test_two_constraints_are_refused_whatever_their_form(gateway_client):
    client = gateway_client()
    err = error_of(chat(client, guided_regex="a+", structured_outputs={"choice": ["a"]}))
    assert "Only one output constraint" in err["message"]
    err = error_of(chat(client, guided_json=PERSON, response_format={"type": "json_object"}))
    assert "Only one output constraint" in err["message"]
    err = error_of(
        chat(
            client, guided_choice=["a"], tools=[{"type": "function", "function": {"name": "f"}}], tool_choice="required"
        )
    )
    assert "cannot be combined with tools" in err["message"]


def test_an_unknown_structured_outputs_field_is_refused_not_ignored(gateway_client):
    # an ignored field would answer unconstrained text where the client asked for a constraint
    response = chat(gateway_client(), structured_outputs={"jsn": PERSON})
    assert response.status_code == 400 and "jsn" in response.text


def test_chat_template_kwargs_reach_the_template(smollm_dir):
    tokenizer = AutoTokenizer.from_pretrained(str(smollm_dir))
    tokenizer.chat_template = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if enable_thinking is defined and not enable_thinking %}/no_think\n{% endif %}"
        "assistant:"
    )
    renderer = PromptRenderer(tokenizer)
    messages = [UserMessage(content="hi")]
    assert renderer.render_chat(messages).text == "user: hi\nassistant:"
    off = renderer.render_chat(messages, template_kwargs={"enable_thinking": False})
    assert off.text == "user: hi\n/no_think\nassistant:"
    assert off.token_ids == tokenizer.encode(off.text, add_special_tokens=False)


def test_the_legacy_structural_tag_masks_what_is_inside_its_tags(service, tokenizer):
    from grammar import GrammarSpec

    legacy = {"structures": [{"begin": "<person>", "schema": PERSON, "end": "</person>"}], "triggers": ["<person>"]}
    handle = service.compile(GrammarSpec.of("structural_tag", legacy))

    def accepts(text: str) -> bool:
        matcher = handle.new_matcher()
        return all(matcher.accept(t) for t in tokenizer.encode(text, add_special_tokens=False))

    assert accepts('Here: <person>{"name": "Ada", "age": 36}</person> done')
    assert not accepts('Here: <person>{"name": 36}')  # inside the tag the schema holds


# ---- the real server and the official client ------------------------------------------------------

MESSAGES = [{"role": "user", "content": "Describe Ada Lovelace, the mathematician, in one short line."}]


@pytest.fixture(scope="module")
def client(jumpgate_server):
    return openai_client(jumpgate_server)


def ask(client, **extra_body):
    response = client.chat.completions.create(
        model=client.models.list().data[0].id, messages=MESSAGES, max_tokens=48, temperature=0, extra_body=extra_body
    )
    return response.choices[0]


@pytest.mark.e2e
@pytest.mark.parametrize("field", ["guided_choice", "structured_outputs"])
def test_a_choice_answers_exactly_one_listed_string(client, field):
    choices = ["mathematician", "poet", "engineer and writer"]
    body = {"guided_choice": choices} if field == "guided_choice" else {"structured_outputs": {"choice": choices}}
    choice = ask(client, **body)
    assert choice.message.content in choices and choice.finish_reason == "stop"


@pytest.mark.e2e
@pytest.mark.parametrize(
    "body",
    [
        {"guided_json": PERSON},
        {"guided_json": json.dumps(PERSON)},
        {"structured_outputs": {"json": PERSON}},
    ],
)
def test_a_vllm_schema_field_gives_valid_json(client, body):
    choice = ask(client, **body)
    jsonschema.validate(json.loads(choice.message.content), PERSON)


@pytest.mark.e2e
def test_a_vllm_regex_field_gives_a_full_match(client):
    pattern = r"[A-Z][a-z]+ (was|is) an? [a-z]+\."
    assert re.fullmatch(pattern, ask(client, guided_regex=pattern).message.content)
    assert re.fullmatch(pattern, ask(client, structured_outputs={"regex": pattern}).message.content)


@pytest.mark.e2e
def test_structural_tags_in_both_forms(client):
    text = ask(client, response_format=ANSWER_TAG).message.content
    assert text.startswith("Answer: ")
    jsonschema.validate(json.loads(text[len("Answer: ") :]), PERSON)
    legacy = {
        "type": "structural_tag",
        "structures": [{"begin": "<person>", "schema": PERSON, "end": "</person>"}],
        "triggers": ["<person>"],
    }
    text = ask(client, response_format=legacy).message.content
    for body in re.findall(r"<person>(.*?)</person>", text, flags=re.S):
        jsonschema.validate(json.loads(body), PERSON)


@pytest.mark.e2e
def test_text_completions_take_the_vllm_forms_too(client):
    model = client.models.list().data[0].id
    out = client.completions.create(
        model=model,
        prompt="Ada Lovelace was a",
        max_tokens=8,
        temperature=0,
        extra_body={"structured_outputs": {"choice": [" mathematician", " poet"]}},
    )
    assert out.choices[0].text in (" mathematician", " poet")
