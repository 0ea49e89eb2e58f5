"""The layout targets of issue #43, held: no Python module over 500 lines, and at most 12 modules
at the top of each package of gateway/, grammar/, runtime/ and bench/ (a package's `__init__.py`
counts where it defines something, not where it only hands names on or holds a docstring;
subpackages do not count: they are where a package puts what outgrows it)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("gateway", "grammar", "runtime", "bench")
MAX_LINES = 500
MAX_MODULES = 12


def _defines_something(init: Path) -> bool:
    tree = ast.parse(init.read_text())
    defs = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Assign, ast.AnnAssign)
    return any(isinstance(node, defs) for node in tree.body)


def _modules(package: Path) -> list[Path]:
    return [p for p in package.glob("*.py") if p.name != "__init__.py" or _defines_something(p)]


def _packages() -> list[Path]:
    found = []
    for top in PACKAGES:
        found += [p.parent for p in (ROOT / top).rglob("__init__.py") if "__pycache__" not in p.parts]
    return sorted(found)


def _python_files() -> list[Path]:
    return sorted(p for top in PACKAGES for p in (ROOT / top).rglob("*.py") if "__pycache__" not in p.parts)


@pytest.mark.parametrize("package", _packages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_a_package_holds_at_most_12_modules_at_its_top(package):
    modules = sorted(p.name for p in _modules(package))
    assert len(modules) <= MAX_MODULES, f"{package.relative_to(ROOT)}: {len(modules)} modules {modules}"


def test_no_module_is_over_500_lines():
    long = {str(p.relative_to(ROOT)): n for p in _python_files() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, long
