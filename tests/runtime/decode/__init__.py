"""Tests of runtime/decode/: strict completeness, number loops, penalties, logprobs."""
