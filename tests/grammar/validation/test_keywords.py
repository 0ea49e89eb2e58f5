"""The keyword table (grammar/validation/keywords/) and the fidelity report agree row by row, and
docs/keywords.md is what the table generates."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from grammar.validation.fidelity import ENFORCED, NEVER_MASKED, spec_fidelity
from grammar.validation.fidelity_walk import VALUE_CHECKED
from grammar.validation.keywords import KEYWORD_TABLE, ROWS, markdown

ROOT = Path(__file__).resolve().parents[3]
DOCS = ROOT / "docs" / "keywords.md"
WALK = ("fidelity_walk.py", "fidelity_scalars.py")
MEANS = {"xgrammar", "llguidance", "value_check", "check_and_rollback", "unenforced", "checked"}
TOOL = "/0/function/parameters"  # where a tool_calls row's example sits in the report


def _example(row):
    """The row's example as its kind's payload, and where its keyword sits in the report."""
    if row.via == "tool_calls":
        tool = {"type": "function", "function": {"name": "f", "parameters": row.example}}
        return {"tools": [tool]}, TOOL + row.pointer
    return row.example, row.pointer


@pytest.mark.parametrize("row", KEYWORD_TABLE, ids=[r.rule or f"{r.keyword}-{r.kept_by}" for r in KEYWORD_TABLE])
def test_the_report_keeps_each_keyword_as_its_row_says(row):
    assert row.kept_by in MEANS and Path(row.module).suffix == ".py"
    assert (Path(__file__).resolve().parents[3] / row.module).exists(), row.module
    payload, pointer = _example(row)
    report = spec_fidelity(row.via, payload, strict=row.strict, retries=4)
    entry = {(k.pointer, k.keyword): k for k in report.keywords}.get((pointer, row.keyword))
    assert entry is not None, [k.as_dict() for k in report.keywords]
    assert (entry.engine if entry.status == ENFORCED else entry.status) == row.kept_by, entry
    assert entry.rule == row.rule, entry  # the report names the row that keeps it
    if row.rule and "{" not in row.reason:
        assert row.reason in entry.reason, entry  # and says what the row says


def test_every_rule_the_walk_names_is_a_row():
    walk = "".join((ROOT / "grammar" / "validation" / name).read_text() for name in WALK)
    named = set(re.findall(r'"([a-zA-Z_]+\.[a-zA-Z_]+)"', walk))
    named |= {f"{k}.{m}" for k in VALUE_CHECKED for m in ("value_check", "inexact")}
    named |= {f"duplicate_keys.{m}" for m in ("value_check", "checked")} | {"beside_combinator.exact"}
    named |= {"beside_combinator.overlap"}
    assert named <= set(ROWS), sorted(named - set(ROWS))
    assert set(ROWS) <= named | set(NEVER_MASKED.values()), sorted(set(ROWS) - named)


def test_docs_keywords_md_is_generated_from_the_table():
    assert DOCS.read_text() == markdown(), "stale: python -m grammar.validation.keywords > docs/keywords.md"
