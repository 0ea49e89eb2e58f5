"""Tests of bench/: the suites, probes, fidelity corpus and the device scripts."""
