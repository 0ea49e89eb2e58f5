"""Tests of runtime/parallel/: tensor parallelism across CPU processes (gloo)."""
