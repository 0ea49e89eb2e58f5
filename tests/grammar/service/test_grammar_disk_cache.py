"""The compiled-grammar disk cache is bounded in bytes: real files, real compiled grammars."""

from __future__ import annotations

import os
import time

import pytest
import xgrammar as xgr

from grammar.service.cache import DiskGrammarCache, disk_namespace
from grammar.settings import GrammarSettings

NS = disk_namespace("tokenizer-a")  # the namespace of the tokenizer these tests store grammars for


@pytest.fixture(scope="module")
def compiled(service):
    """Three small compiled grammars for the real tokenizer, and that tokenizer's info."""
    compiler = xgr.GrammarCompiler(service.tokenizer_info, cache_enabled=False)
    grammars = {key: compiler.compile_regex(pattern) for key, pattern in (("k_a", "a+"), ("k_b", "b+"), ("k_c", "c+"))}
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
    cache = DiskGrammarCache(tmp_path, info, NS, max_bytes=budget)
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
    cache = DiskGrammarCache(tmp_path, info, NS, max_bytes=1)
    cache.store("k_a", grammars["k_a"])
    assert stored_keys(cache) == {"k_a"}
    cache.store("k_b", grammars["k_b"])
    assert stored_keys(cache) == {"k_b"}
    assert cache.load("k_b") is not None


def test_another_writers_temp_file_is_never_evicted(tmp_path, compiled):
    info, grammars = compiled
    in_progress = tmp_path / NS / ".k_other.abc123.tmp"  # what a concurrent server's store writes first
    in_progress.parent.mkdir()
    in_progress.write_text("x" * 100_000)
    cache = DiskGrammarCache(tmp_path, info, NS, max_bytes=10)
    cache.store("k_a", grammars["k_a"])
    cache.store("k_b", grammars["k_b"])
    assert in_progress.exists()
    assert stored_keys(cache) == {"k_b"}


def test_a_file_evicted_by_another_server_reads_as_a_miss(tmp_path, compiled):
    info, grammars = compiled
    cache = DiskGrammarCache(tmp_path, info, NS)
    cache.store("k_a", grammars["k_a"])
    other_server = DiskGrammarCache(tmp_path, info, NS, max_bytes=1)
    other_server.store("k_b", grammars["k_b"])
    assert cache.load("k_a") is None
    assert cache.load("k_b") is not None


def test_a_smaller_budget_at_start_evicts_the_oldest_files(tmp_path, compiled):
    info, grammars = compiled
    cache = DiskGrammarCache(tmp_path, info, NS)
    for seconds_ago, key in ((30, "k_a"), (20, "k_b"), (10, "k_c")):
        cache.store(key, grammars[key])
        age(cache, key, seconds_ago)
    budget = file_size(cache, "k_c") + file_size(cache, "k_b")
    restarted = DiskGrammarCache(tmp_path, info, NS, max_bytes=budget)
    assert stored_keys(restarted) == {"k_b", "k_c"}
    assert restarted.keys_newest_first() == ["k_c", "k_b"]


def test_the_disk_budget_flag_sets_megabytes():
    assert GrammarSettings().max_disk_bytes == 1024 << 20
    assert GrammarSettings(disk_cache_mb=3).max_disk_bytes == 3 << 20
    with pytest.raises(ValueError, match="--grammar-cache-disk-mb"):
        GrammarSettings(disk_cache_mb=0)


# ---- a folder shared with other tokenizers, xgrammar versions and earlier Jumpgate versions ----


def foreign_files(tmp_path) -> dict:
    """Files another model's or version's server left in the shared folder: another namespace's
    grammar, a grammar a Jumpgate without namespaces wrote at the top, and another namespace's
    fresh-looking temp file. None of them is this cache's."""
    other = tmp_path / disk_namespace("tokenizer-b")
    other.mkdir()
    files = {
        other / "k_a.json": b'{"not": "for tokenizer a"}',
        tmp_path / "k_b.json": b"written by an older Jumpgate",
        other / ".k_c.abc.tmp": b"x",
    }
    for path, data in files.items():
        path.write_bytes(data)
    old = time.time() - 3600  # old enough to be evicted first, or cleaned as a stale temp file
    for path in files:
        os.utime(path, (old, old))
    return files


def test_other_namespaces_files_are_never_read_evicted_or_deleted(tmp_path, compiled):
    info, grammars = compiled
    foreign = foreign_files(tmp_path)
    cache = DiskGrammarCache(tmp_path, info, NS, max_bytes=1)  # evicts all it may at start and on each store
    assert cache.keys_newest_first() == []
    assert cache.load("k_a") is None and cache.load("k_b") is None  # same keys, other namespaces: misses
    cache.store("k_a", grammars["k_a"])
    cache.store("k_b", grammars["k_b"])
    assert stored_keys(cache) == {"k_b"}  # the budget holds within the namespace
    assert {path: path.read_bytes() for path in foreign} == foreign
    assert cache.directory == tmp_path / NS


def test_a_damaged_file_of_our_own_namespace_is_discarded(tmp_path, compiled):
    info, grammars = compiled
    cache = DiskGrammarCache(tmp_path, info, NS)
    cache.store("k_a", grammars["k_a"])
    text = cache.path("k_a").read_text()
    cache.path("k_a").write_text(text[: len(text) // 2])  # truncated
    assert cache.load("k_a") is None
    assert not cache.path("k_a").exists()


def test_the_namespace_follows_the_tokenizer_and_the_versions(monkeypatch):
    from grammar.service import cache as cache_module

    a = disk_namespace("tokenizer-a")
    assert a == disk_namespace("tokenizer-a") != disk_namespace("tokenizer-b")
    monkeypatch.setattr(cache_module, "DISK_FORMAT", cache_module.DISK_FORMAT + 1)
    assert disk_namespace("tokenizer-a") != a
    monkeypatch.undo()
    monkeypatch.setattr(cache_module, "xgrammar_version", lambda: "0.0.0-other")
    assert disk_namespace("tokenizer-a") != a
