"""Tests of runtime/engine/: the step loop, scheduling and priorities, engine reliability."""
