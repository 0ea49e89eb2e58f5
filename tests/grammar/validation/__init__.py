"""Tests of grammar/validation/: spec checks and the fidelity table, on both engines."""
