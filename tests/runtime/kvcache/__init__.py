"""Tests of runtime/kvcache/: the radix cache, the hierarchical tiers, the shared disk tier."""
