"""Tests of runtime/: engine, scheduler, KV cache, model, decoding, attention and the CPU kernels."""
