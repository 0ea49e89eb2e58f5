"""The KV cache: the token-slot pool, the radix prefix cache, the hierarchical tiers and the cache manager."""
