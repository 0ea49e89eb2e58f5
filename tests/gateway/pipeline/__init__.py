"""Tests of gateway/pipeline/: prompts, schema budgets, output validation."""
