"""The lower tiers of the KV cache: the host pool (L2) and the disk store (L3), and what each knows of a radix node."""
