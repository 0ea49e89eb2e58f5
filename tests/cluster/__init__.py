"""Tests of gateway/cluster/: routing units and Ray Serve end to end."""
