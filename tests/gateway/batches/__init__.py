"""Tests of gateway/batches/: the Files and Batch API, their store."""
