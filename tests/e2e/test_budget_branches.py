"""Budget-aware closing across branch choices (issue #42 item 1).

A token without structure characters can still commit the output to a much longer completion: a
tool's name (`create_calendar_event` must still write two date-times where `calculator` needs one
short string), a property's name, an enum member. The guard must check such tokens near the budget
as it checks `,` or `{`; before, an agent's tool call at a low `max_tokens` chose the long tool
and ended `length` inside its date-time.

First the guard on the real tool-call grammar (no model), then the real server answering the
official client at budgets low enough that closing must act.
"""

from __future__ import annotations

import json

import jsonschema
import pytest

from bench.harness.chat_workloads import agent_messages
from bench.harness.server_process import MODEL
from bench.harness.workloads import agent_system_prompt, agent_tools
from grammar import GrammarSpec
from grammar.kinds.tool_calls.parser import parse_tool_calls
from runtime.decode.completeness import CompletionGuard
from tests.conftest import openai_client

TOOLS = agent_tools()
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
NAME_STATE = '<tool_call>{"name":"'


def matcher_at(service, tokenizer, text: str):
    matcher = service.compile(GrammarSpec.tool_calls(TOOLS, "required", True)).new_matcher()
    for t in tokenizer.encode(text, add_special_tokens=False):
        assert matcher.accept(t)
    return matcher


def test_a_tool_name_is_checked_against_the_budget(service, tokenizer):
    matcher = matcher_at(service, tokenizer, NAME_STATE)
    (create,) = tokenizer.encode("create", add_special_tokens=False)
    assert matcher.may_expand(create)  # no `,` `{` `"` in it, but it chooses the long tool
    shortest = matcher.completion_plan()
    assert shortest is not None and len(shortest) < 30
    after_create = matcher.completion_bound_after(create)
    assert after_create is not None and after_create > len(shortest) + 30

    produced, budget = len(tokenizer.encode(NAME_STATE, add_special_tokens=False)), 48
    guard = CompletionGuard()
    guard.before_choice(matcher, produced, budget)
    remaining = budget - produced
    assert after_create > remaining - 1
    assert not guard.allows(matcher, create, remaining)  # the long tool cannot finish in the budget
    assert guard.allows(matcher, shortest[0], remaining)  # the shortest one can


def test_content_of_a_free_string_is_not_checked(service, tokenizer):
    # inside a string that may end now, content leaves the shortest completion as it was
    matcher = matcher_at(service, tokenizer, NAME_STATE + 'calculator","arguments":{"expression":"1')
    (plus,) = tokenizer.encode("+", add_special_tokens=False)
    assert not matcher.may_expand(plus)


@pytest.fixture(scope="module")
def client(jumpgate_server):
    return openai_client(jumpgate_server)


@pytest.mark.e2e
@pytest.mark.parametrize("max_tokens", [40, 48, 64])
def test_agent_tool_calls_at_low_budgets_are_whole_and_valid(client, tokenizer, max_tokens):
    """The serve bench's agent workload (its prompt, tools, tool_choice required, greedy) with
    max_tokens lowered until closing must act: every call whole, named and valid."""
    system = agent_system_prompt(tokenizer, 1500)
    for i in range(12):
        r = client.chat.completions.create(
            model=MODEL,
            messages=agent_messages(system, i),
            tools=TOOLS,
            tool_choice="required",
            temperature=0,
            max_tokens=max_tokens,
        )
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls", (i, choice)
        assert r.usage.completion_tokens <= max_tokens
        calls = choice.message.tool_calls
        assert calls, (i, choice)
        for call in calls:
            jsonschema.validate(json.loads(call.function.arguments), PARAMS[call.function.name])


def test_parser_reads_what_the_grammar_writes(service, tokenizer):
    # the shortest completion from the name state is itself a call the gateway's parser reads
    matcher = matcher_at(service, tokenizer, NAME_STATE)
    text = NAME_STATE + tokenizer.decode(matcher.completion_plan())
    content, calls = parse_tool_calls(text)
    assert content == "" and len(calls) == 1
    jsonschema.validate(json.loads(calls[0].arguments), PARAMS[calls[0].name])
