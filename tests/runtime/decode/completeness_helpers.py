"""What the completeness tests share: the corpus schemas and regexes, a fake matcher for the
guard (tests/runtime/decode/test_number_loops.py uses it too), compiling a schema, validating output."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema

from grammar import GrammarSpec

DATA = Path(__file__).parents[2] / "data"
SCHEMAS = {p.stem: json.loads(p.read_text()) for p in sorted((DATA / "schema_corpus").glob("*.json"))}
# see tests/grammar/test_grammar_e2e.py: keywords xgrammar compiles without enforcing them
UNENFORCED = {"if_then_else_country_postal": {"if", "then", "else"}, "numeric_bounds_sensor": {"multipleOf"}}


def errors_of(name: str, schema: dict, value) -> list[str]:
    validator = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)(schema)
    skip = UNENFORCED.get(name, set())
    return [e.message for e in validator.iter_errors(value) if not skip & set(map(str, e.absolute_schema_path))]


# ==== a fake matcher for the guard (runtime/decode/completeness.py) ====================================


class FakeMatcher:
    """A matcher whose shortest completion is `plan` (a list of ids), consumed token by token when
    the output follows it; a token in `detours` (another closer, say) puts one token in front of
    the plan; any other token (free text) leaves it as is. Records fills."""

    def __init__(self, plan: list[int], detours: frozenset[int] = frozenset()):
        self.plan = list(plan)
        self.detours = detours
        self.fills: list[tuple] = []
        self.plans_made = 0
        self.bound_after: dict[int, int] = {}

    # the interface CompletionGuard uses
    def completion_plan(self):
        self.plans_made += 1
        return list(self.plan)

    def completion_bound(self):
        return len(self.plan)

    def completion_bound_after(self, token_id):
        return self.bound_after.get(token_id, max(0, len(self.plan) - 1))

    def may_expand(self, token_id):
        return token_id in self.bound_after

    def fill_bitmask(self, mask, row):
        self.fills.append(("plain",))

    def fill_closing_bitmask(self, mask, row, tight=False, plan_token=None):
        self.fills.append(("closing", tight, plan_token))

    def fill_plan_bitmask(self, mask, row, token_id):
        self.fills.append(("plan", token_id))

    def fill_value_closing_bitmask(self, mask, row):
        self.fills.append(("value",))
        return True

    # test driver: the engine's accept
    def take(self, token_id):
        if self.plan and token_id == self.plan[0]:
            self.plan.pop(0)
        elif token_id in self.detours:
            self.plan = [900] + self.plan


# ==== a schema's grammar (grammar/checks/closing.py's tests and the real SmolLM2's) ====================


def compile_schema(service, schema):
    return service.compile(GrammarSpec.json_schema(schema))
