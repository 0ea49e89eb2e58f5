"""Tests of gateway/ over the scripted engine (tests/fake_engine.py): routes, wire formats, registry, errors."""
