"""Tests of grammar/: specs and kinds, schema checks and rewrites, both engines, value checks, the service."""
