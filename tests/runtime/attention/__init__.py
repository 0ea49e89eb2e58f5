"""Tests of runtime/attention/ and the kernels: tiles, cascade, CPU and Triton attention."""
