"""Probes: one-off measurements of one part, each run as `python -m bench.probes.NAME [...]` and
printing one JSON line per result. Unlike the suites of `python -m bench` they take no `--quick`
and CI does not run them (tests/bench/test_quant_linear_bench.py and tests/runtime/attention/test_triton_kernels_ops.py test
two); `python -m bench --help` lists them."""
