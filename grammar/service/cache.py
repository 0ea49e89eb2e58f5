"""Where compiled grammars are kept: a bounded LRU in memory and one file per key on disk.

The disk copy makes a restart warm (deserializing takes about a millisecond, compiling can take
seconds). Files are written atomically (temp file + os.replace), so a crash never leaves a half
file under a real name. The folder may be shared by servers of other models, tokenizers, xgrammar
or Jumpgate versions: each writes only under its own namespace folder (`disk_namespace`: a hash of
the tokenizer fingerprint, the xgrammar version and the file format), and reads, lists, evicts and
cleans only there, so another's files are never opened as ours, let alone deleted. A file in our
own namespace that cannot be read is therefore genuinely corrupt (truncated, damaged): it is
discarded with a warning and the grammar recompiled. Each namespace is bounded in bytes: a hit sets
its file's mtime to now (atime is often off or relaxed), and after each write the files with the
oldest mtime go until the rest fit. Several servers of one namespace (replicas) may share it: only
finished files are ever evicted (temp files belong to their writer until the 10-minute stale rule),
and a file evicted under a reader reads as a miss.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import threading
import time
from collections import OrderedDict
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Callable, Generic, TypeVar

import xgrammar as xgr

log = logging.getLogger("jumpgate.grammar.cache")

V = TypeVar("V")

# what deserializing refuses: InvalidJSON / DeserializeFormat / DeserializeVersion
DESERIALIZE_ERRORS = (RuntimeError, ValueError, TypeError)


# how a grammar file is laid out; bump it when that changes, so older files sit in another namespace
DISK_FORMAT = 1


def xgrammar_version() -> str:
    try:
        return version("xgrammar")
    except PackageNotFoundError:  # a source tree without package metadata
        return "unknown"


def disk_namespace(fingerprint: str) -> str:
    """The folder (under the cache root) of grammars compiled for the tokenizer with `fingerprint`
    by this xgrammar version, in this file format: nothing else can deserialize them."""
    digest = hashlib.sha256(f"{fingerprint}|xgrammar={xgrammar_version()}|format={DISK_FORMAT}".encode())
    return "xgr-" + digest.hexdigest()[:32]


def grammar_from_json(text: str, tokenizer_info: xgr.TokenizerInfo) -> xgr.CompiledGrammar:
    """A grammar from its `CompiledGrammar.serialize_json()` text (a disk file, a compile process's
    answer), bound to `tokenizer_info`; raises one of DESERIALIZE_ERRORS for text it cannot read."""
    return xgr.CompiledGrammar.deserialize_json(text, tokenizer_info)


class MemoryLRU(Generic[V]):
    """Thread-safe LRU map with at most `max_entries` entries and, when `max_bytes` is set, at most
    that many bytes by `size_of(value)`. The newest entry always stays, even alone over the byte
    budget: it is the one a request is about to use."""

    def __init__(
        self, max_entries: int, max_bytes: int | None = None, size_of: Callable[[V], int] | None = None
    ) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be >= 1")
        if max_bytes is not None and (max_bytes < 1 or size_of is None):
            raise ValueError("max_bytes must be >= 1 and needs size_of")
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._size_of = size_of
        self._entries: OrderedDict[str, tuple[V, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def total_bytes(self) -> int:
        with self._lock:
            return self._bytes

    def get(self, key: str) -> V | None:
        with self._lock:
            item = self._entries.get(key)
            if item is None:
                return None
            self._entries.move_to_end(key)
            return item[0]

    def put(self, key: str, value: V) -> None:
        size = int(self._size_of(value)) if self._size_of is not None else 0
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            self._entries[key] = (value, size)
            self._bytes += size
            while len(self._entries) > 1 and (
                len(self._entries) > self.max_entries or (self.max_bytes is not None and self._bytes > self.max_bytes)
            ):
                _, (_, evicted) = self._entries.popitem(last=False)
                self._bytes -= evicted

    def __contains__(self, key: str) -> bool:
        with self._lock:
            return key in self._entries

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def keys(self) -> list[str]:
        """Keys from least to most recently used."""
        with self._lock:
            return list(self._entries)


STALE_TEMP_S = 600.0  # an atomic write takes milliseconds; a temp file this old lost its writer


def remove_stale_temp_files(directory: Path, pattern: str, older_than_s: float = STALE_TEMP_S) -> int:
    """Delete temp files (matching `pattern`) left by writers killed between write and rename.
    Only old ones: another process may be writing a fresh one right now. Returns how many."""
    removed = 0
    cutoff = time.time() - older_than_s
    for path in Path(directory).glob(pattern):
        try:
            if path.stat().st_mtime < cutoff:
                path.unlink()
                removed += 1
        except OSError:  # gone meanwhile, or not ours to delete: leave it
            continue
    if removed:
        log.info("removed %d stale temp file(s) in %s", removed, directory)
    return removed


class DiskGrammarCache:
    """`<root>/<namespace>/<key>.json` holding `CompiledGrammar.serialize_json()` for one tokenizer
    (`namespace`: `disk_namespace` of its fingerprint). Everything outside `directory`, the
    namespace's folder, belongs to other tokenizers or versions and is never touched."""

    SUFFIX = ".json"
    TEMP_PATTERN = ".*.tmp"

    def __init__(
        self, root: Path, tokenizer_info: xgr.TokenizerInfo, namespace: str, max_bytes: int | None = None
    ) -> None:
        if max_bytes is not None and max_bytes < 1:
            raise ValueError("max_bytes must be >= 1")
        if not namespace or "/" in namespace or namespace.startswith("."):
            raise ValueError(f"invalid grammar cache namespace {namespace!r}")
        self.root = Path(root)
        self.directory = self.root / namespace
        self.directory.mkdir(parents=True, exist_ok=True)
        self._tokenizer_info = tokenizer_info
        self.max_bytes = max_bytes
        remove_stale_temp_files(self.directory, self.TEMP_PATTERN)
        self.evict_beyond_budget()  # the budget may have shrunk since the last run

    def path(self, key: str) -> Path:
        return self.directory / f"{key}{self.SUFFIX}"

    def load(self, key: str) -> xgr.CompiledGrammar | None:
        """The stored grammar, or None if absent; an unreadable file is deleted (and logged): in our
        namespace it can only be a damaged one of ours."""
        path = self.path(key)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as e:
            self._discard(path, e)
            return None
        try:
            compiled = grammar_from_json(text, self._tokenizer_info)
        except DESERIALIZE_ERRORS as e:
            self._discard(path, e)
            return None
        self._touch(path)
        return compiled

    def store(self, key: str, compiled: xgr.CompiledGrammar | str) -> None:
        """Write a grammar (or its serialize_json() text) atomically; failures only cost a future
        recompile, so they are logged, not raised."""
        path = self.path(key)
        tmp_name = None
        try:
            data = compiled if isinstance(compiled, str) else compiled.serialize_json()
            fd, tmp_name = tempfile.mkstemp(prefix=f".{key[:16]}.", suffix=".tmp", dir=self.directory)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(data)
            os.replace(tmp_name, path)
            tmp_name = None
        except (OSError, RuntimeError) as e:
            log.warning("grammar cache: could not write %s: %s", path, e)
        finally:
            if tmp_name is not None:
                try:
                    os.unlink(tmp_name)
                except OSError:
                    pass
        self.evict_beyond_budget(keep=key)

    def evict_beyond_budget(self, keep: str | None = None) -> int:
        """Delete the least recently used files until the folder fits `max_bytes`; `keep` (the file
        just written: a request is about to use it) always stays. Returns how many went."""
        if self.max_bytes is None:
            return 0
        files = self._finished_files()
        total = sum(size for _, size, _ in files)
        removed = 0
        for _, size, path in sorted(files):  # oldest mtime first
            if total <= self.max_bytes:
                break
            if path.name == f"{keep}{self.SUFFIX}":
                continue
            try:
                path.unlink()
            except FileNotFoundError:  # another server evicted it first: the bytes are gone all the same
                pass
            except OSError as e:
                log.warning("grammar cache: could not evict %s: %s", path, e)
                continue
            total -= size
            removed += 1
        if removed:
            log.info(
                "grammar cache: evicted %d least recently used file(s) from %s (budget %d bytes)",
                removed,
                self.directory,
                self.max_bytes,
            )
        return removed

    def total_bytes(self) -> int:
        return sum(size for _, size, _ in self._finished_files())

    def keys_newest_first(self) -> list[str]:
        return [path.name[: -len(self.SUFFIX)] for _, _, path in sorted(self._finished_files(), reverse=True)]

    def _finished_files(self) -> list[tuple[int, int, Path]]:
        """(mtime ns, size, path) of every complete entry; temp files of unfinished writes are not."""
        found = []
        for path in self.directory.glob(f"*{self.SUFFIX}"):
            if path.name.startswith("."):  # a temp file of an unfinished write
                continue
            try:
                st = path.stat()
            except OSError:  # removed meanwhile
                continue
            found.append((st.st_mtime_ns, st.st_size, path))
        return found

    @staticmethod
    def _touch(path: Path) -> None:
        """Mark a hit: the eviction order is by mtime."""
        try:
            os.utime(path)
        except OSError:  # evicted meanwhile, or a read-only folder: the order is only a hint
            pass

    @staticmethod
    def _discard(path: Path, error: BaseException) -> None:
        log.warning(
            "grammar cache: discarding unreadable %s (%s: %s); it will be recompiled",
            path,
            type(error).__name__,
            str(error).strip()[:200],
        )
        try:
            path.unlink()
        except OSError:
            pass
