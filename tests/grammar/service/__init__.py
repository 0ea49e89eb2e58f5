"""Tests of grammar/service/: the service, its disk cache, compile processes and workers."""
