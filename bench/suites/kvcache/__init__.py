"""The KV-cache suites: the prefix cache on agent workloads (cache), cascade attention over a shared
prefix (cascade), and the host/disk tiers (hicache)."""
