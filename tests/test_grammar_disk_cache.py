"""The compiled-grammar disk cache is bounded in bytes: real files, real compiled grammars."""

from __future__ import annotations

import os
import time

import pytest
import xgrammar as xgr

from grammar.cache import DiskGrammarCache
from grammar.settings import GrammarSettings


@pytest.fixture(scope="module")
def compiled(service):
    """Three small compiled grammars for the real tokenizer, and that tokenizer's info."""
    compiler = xgr.GrammarCompiler(service.tokenizer_info, cache_enabled=False)
    grammars = {key: compiler.compile_regex(pattern) for key, pattern in
                (("k_a", "a+"), ("k_b", "b+"), ("k_c", "c+"))}
    return service.tokenizer_info, grammars


def serialized_size(grammar: xgr.CompiledGrammar) -> int:
    return len(grammar.serialize_json().encode())


def file_size(cache: DiskGrammarCache, key: str) -> int:
    return cache.path(key).stat().st_size


def age(cache: DiskGrammarCache, key: str, seconds_ago: float) -> None:
    """Date a file back explicitly: mtime granularity would make same-second writes a tie."""
    when = time.time() - seconds_ago
    os.utime(cache.path(key), (when, when))


def stored_keys(cache: DiskGrammarCache) -> set[str]:
    return set(cache.keys_newest_first())


def test_beyond_the_byte_budget_the_least_recently_used_file_goes(tmp_path, compiled):
    info, grammars = compiled
    budget = serialized_size(grammars["k_a"]) + serialized_size(grammars["k_c"])  # not room for all three
    cache = DiskGrammarCache(tmp_path, info, max_bytes=budget)
    cache.store("k_a", grammars["k_a"])
    cache.store("k_b", grammars["k_b"])
    age(cache, "k_a", 100)
    age(cache, "k_b", 50)
    assert cache.load("k_a") is not None  # a hit: k_a is now the most recently used
    cache.store("k_c", grammars["k_c"])
    assert stored_keys(cache) == {"k_a", "k_c"}
    assert cache.total_bytes() <= cache.max_bytes


def test_the_file_just_written_stays_even_alone_over_the_budget(tmp_path, compiled):
    info, grammars = compiled
    cache = DiskGrammarCache(tmp_path, info, max_bytes=1)
    cache.store("k_a", grammars["k_a"])
    assert stored_keys(cache) == {"k_a"}
    cache.store("k_b", grammars["k_b"])
    assert stored_keys(cache) == {"k_b"}
    assert cache.load("k_b") is not None


def test_another_writers_temp_file_is_never_evicted(tmp_path, compiled):
    info, grammars = compiled
    in_progress = tmp_path / ".k_other.abc123.tmp"  # what a concurrent server's store writes first
    in_progress.write_text("x" * 100_000)
    cache = DiskGrammarCache(tmp_path, info, max_bytes=10)
    cache.store("k_a", grammars["k_a"])
    cache.store("k_b", grammars["k_b"])
    assert in_progress.exists()
    assert stored_keys(cache) == {"k_b"}


def test_a_file_evicted_by_another_server_reads_as_a_miss(tmp_path, compiled):
    info, grammars = compiled
    cache = DiskGrammarCache(tmp_path, info)
    cache.store("k_a", grammars["k_a"])
    other_server = DiskGrammarCache(tmp_path, info, max_bytes=1)
    other_server.store("k_b", grammars["k_b"])
    assert cache.load("k_a") is None
    assert cache.load("k_b") is not None


def test_a_smaller_budget_at_start_evicts_the_oldest_files(tmp_path, compiled):
    info, grammars = compiled
    cache = DiskGrammarCache(tmp_path, info)
    for seconds_ago, key in ((30, "k_a"), (20, "k_b"), (10, "k_c")):
        cache.store(key, grammars[key])
        age(cache, key, seconds_ago)
    budget = file_size(cache, "k_c") + file_size(cache, "k_b")
    restarted = DiskGrammarCache(tmp_path, info, max_bytes=budget)
    assert stored_keys(restarted) == {"k_b", "k_c"}
    assert restarted.keys_newest_first() == ["k_c", "k_b"]


def test_the_disk_budget_flag_sets_megabytes():
    assert GrammarSettings().max_disk_bytes == 1024 << 20
    assert GrammarSettings(disk_cache_mb=3).max_disk_bytes == 3 << 20
    with pytest.raises(ValueError, match="--grammar-cache-disk-mb"):
        GrammarSettings(disk_cache_mb=0)
