"""The keyword table: each JSON Schema keyword, how it is kept, under which condition, by which module,
and what the fidelity report says about it.

One row per way a keyword is kept, each with a small schema in which it is kept that way. The
fidelity report is built from these rows: the walk (fidelity_walk.py, fidelity_scalars.py) decides
which row applies to a keyword and names it by its `rule`; the row gives the entry its status,
engine and reason (`fidelity_report.keyword_entry`). A keyword with no rule is masked plainly by the
engine. tests/grammar/validation/test_keywords.py classifies every row's example with
`spec_fidelity` and fails where the report names another row or keeps it otherwise, and
docs/keywords.md is generated from this table (`python -m grammar.validation.keywords >
docs/keywords.md`; a test fails when the file is stale). Means: `xgrammar` / `llguidance` (the
engine's token mask), `value_check` (Jumpgate's mask over names and items), `check_and_rollback`
(the finished value checked, a failing one rewritten), `unenforced` (refused in strict mode),
`checked` (a risk validation reports after generation; strict mode lets it through).
"""

from __future__ import annotations

from grammar.validation.keywords.after_generation import AFTER_GENERATION_ROWS
from grammar.validation.keywords.masked import MASKED_ROWS
from grammar.validation.keywords.row import KeywordRow

KEYWORD_TABLE: tuple[KeywordRow, ...] = MASKED_ROWS + AFTER_GENERATION_ROWS

# The rows the report names, by rule.
ROWS: dict[str, KeywordRow] = {row.rule: row for row in KEYWORD_TABLE if row.rule}
if len(ROWS) != sum(bool(row.rule) for row in KEYWORD_TABLE):
    raise ValueError("two rows of the keyword table share a rule")
# Keyword -> the rule that keeps it where the walk has nothing more specific to say.
DEFAULT_RULES: dict[str, str] = {keyword: row.rule for row in KEYWORD_TABLE for keyword in row.default_for}


def markdown() -> str:
    """docs/keywords.md."""
    lines = [
        "# JSON Schema keywords: how each is kept",
        "",
        "Generated from `grammar/validation/keywords/` (`python -m grammar.validation.keywords > docs/keywords.md`);",
        "each row's example schema is classified by the fidelity report in the tests, so the table and the code",
        "cannot drift. What the means are: [structured-output.md](structured-output.md).",
        "",
        "| keyword | kept by | when | where |",
        "|---|---|---|---|",
    ]
    lines += [f"| {r.keywords} | {r.kept_by} | {r.condition or 'always'} | `{r.module}` |" for r in KEYWORD_TABLE]
    return "\n".join(lines) + "\n"
