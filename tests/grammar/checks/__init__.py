"""Tests of grammar/checks/: the value check, check-and-roll-back, closing plans."""
