"""What the suites share: JSON output and commits (common), real server processes (server_process),
the agent workloads (workloads), and the cluster chaos helper (replica_killer)."""
