"""Tests of gateway/messages/: the Messages API and its translation."""
