"""The keyword table (grammar/validation/keywords.py) and the fidelity report agree row by row, and
docs/keywords.md is what the table generates."""

from __future__ import annotations

from pathlib import Path

import pytest

from grammar.validation.fidelity import ENFORCED, spec_fidelity
from grammar.validation.keywords import KEYWORD_TABLE, markdown

DOCS = Path(__file__).resolve().parents[3] / "docs" / "keywords.md"
MEANS = {"xgrammar", "llguidance", "value_check", "check_and_rollback", "unenforced"}


@pytest.mark.parametrize("row", KEYWORD_TABLE, ids=[f"{r.keyword}-{r.kept_by}" for r in KEYWORD_TABLE])
def test_the_report_keeps_each_keyword_as_its_row_says(row):
    assert row.kept_by in MEANS and Path(row.module).suffix == ".py"
    assert (Path(__file__).resolve().parents[3] / row.module).exists(), row.module
    report = spec_fidelity("json_schema", row.example, strict=True, retries=4)
    entry = {(k.pointer, k.keyword): k for k in report.keywords}.get((row.pointer, row.keyword))
    assert entry is not None, [k.as_dict() for k in report.keywords]
    assert (entry.engine if entry.status == ENFORCED else entry.status) == row.kept_by, entry


def test_docs_keywords_md_is_generated_from_the_table():
    assert DOCS.read_text() == markdown(), "stale: python -m grammar.validation.keywords > docs/keywords.md"
