"""Tests of grammar/engines/: the xgrammar and llguidance matchers, tokenizers, draft splitting."""
