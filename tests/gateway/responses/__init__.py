"""Tests of gateway/responses/: the Responses API over the scripted engine."""
