"""`python -m grammar.validation.keywords > docs/keywords.md`."""

from grammar.validation.keywords import markdown

print(markdown(), end="")
