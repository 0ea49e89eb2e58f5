"""dependentRequired by its other spellings (grammar/checks/value_rules.py's name_dependencies): draft-7
`dependencies` of names, and `if` one name is present `then` others are (no `else`). Strict mode
accepts them where it accepts dependentRequired, the value check keeps them at the mask on either
engine, and what is not exactly that rule stays refused."""

from __future__ import annotations

import pytest

from grammar import GrammarSpec
from grammar.checks.value_rules import name_dependencies, required_conditional
from grammar.engines.llguidance.matcher import LLGuidanceHandle
from grammar.validation.fidelity import ENFORCED, LLGUIDANCE, VALUE_CHECK, XGRAMMAR, routed_schema_fidelity
from tests.grammar.validation.test_pattern_properties import masked_writes

PROPS = {
    "name": {"type": "string"},
    "card": {"type": "string"},
    "cvv": {"type": "string"},
    "address": {"type": "string"},
}
DEPENDENCIES = {
    "type": "object",
    "properties": PROPS,
    "required": ["name"],
    "dependencies": {"card": ["cvv", "address"]},
}
CONDITIONAL = {
    "type": "object",
    "properties": PROPS,
    "required": ["name"],
    "if": {"required": ["card"], "description": "paying by card"},
    "then": {"required": ["cvv", "address"]},
}
# the same rule with a pattern xgrammar would drop beside maxLength: compiled by llguidance
CONDITIONAL_LLG = {
    **CONDITIONAL,
    "properties": {**PROPS, "cvv": {"type": "string", "pattern": "^[0-9]+$", "maxLength": 4}},
}


def test_the_spellings_are_read_as_dependent_required():
    assert name_dependencies(DEPENDENCIES) == {"card": ["cvv", "address"]}
    assert name_dependencies(CONDITIONAL) == {"card": ["cvv", "address"]}
    both = {**DEPENDENCIES, "dependentRequired": {"card": ["cvv"], "cvv": ["card"]}}
    assert name_dependencies(both) == {"card": ["cvv", "address"], "cvv": ["card"]}


@pytest.mark.parametrize(
    "node",
    [
        {**CONDITIONAL, "else": {"required": ["card"]}},  # an else is another rule
        {**CONDITIONAL, "if": {"required": ["card", "cvv"]}},  # two triggers
        {**CONDITIONAL, "if": {"required": ["card"], "properties": {"card": {"const": "x"}}}},  # a value test
        {**CONDITIONAL, "then": {"required": ["cvv"], "properties": {"cvv": {"minLength": 3}}}},  # more than names
    ],
)
def test_other_conditionals_are_not_this_rule(node):
    assert required_conditional(node) is None


@pytest.mark.parametrize(
    "schema,pointers,engine",
    [
        (DEPENDENCIES, ["/dependencies"], XGRAMMAR),
        (CONDITIONAL, ["/if", "/then"], XGRAMMAR),
        (CONDITIONAL_LLG, ["/if", "/then"], LLGUIDANCE),
    ],
)
def test_strict_accepts_them_as_the_value_check_keeps_them(service, tokenizer, schema, pointers, engine):
    report = routed_schema_fidelity(schema, strict=True)
    assert report.refused_in_strict == () and report.engine == engine
    verdicts = {k.pointer: (k.status, k.engine) for k in report.keywords}
    assert all(verdicts[p] == (ENFORCED, VALUE_CHECK) for p in pointers)
    handle = service.compile(GrammarSpec("json_schema", schema, True))
    assert isinstance(handle, LLGuidanceHandle) == (engine == LLGUIDANCE)
    assert masked_writes(handle, tokenizer, '{"name":"Al"}')
    assert masked_writes(handle, tokenizer, '{"name":"Al","card":"4111","cvv":"123","address":"Main St"}')
    assert not masked_writes(handle, tokenizer, '{"name":"Al","card":"4111"}')  # cannot close without them
    assert not masked_writes(handle, tokenizer, '{"name":"Al","card":"4111","cvv":"123"}')
    assert not masked_writes(handle, tokenizer, '{"name":"Al","card":"4111","address":"Main St"}')  # skips cvv
