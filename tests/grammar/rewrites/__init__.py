"""Tests of grammar/rewrites/: each lowering proved on both engines."""
