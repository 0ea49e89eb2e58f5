"""Tests of gateway/registry/: the schema registry and pinned prefixes."""
