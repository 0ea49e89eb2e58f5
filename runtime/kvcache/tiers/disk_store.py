"""The L3 tier: KV pages as files in a cache folder, found again after a restart.

One file per page of `page_tokens` tokens. A page is named by a chained hash:
`h[i] = sha256(h[i-1] + token ids of page i)`, seeded with the model's identity (weights
fingerprint, dtype, layer/head shape, page size) and the cache namespace. So a page file holds the
KV of exactly one token prefix of one model, and a new process finds a prompt's pages by hashing
the prompt page by page and checking which files exist: no index has to survive a restart (the
in-memory index is rebuilt by scanning the folder).

Several processes may share the folder (engine replicas, `docs/cluster.md`). A page missing from
this process's index is looked up in the folder by its name (`contains` stats the file), so a
replica finds the pages another one wrote since; every `SYNC_S` seconds of writing the writer
re-reads the folder, so the byte budget covers the whole folder and pages deleted by other
processes leave the index. Temp files are never shared or deleted while their writer may still
rename them (`runtime/kvcache/tiers/shared_folder.py`); a page deleted by another process between lookup and
read is a miss. Reads touch the file's mtime, so the folder's LRU order is every process's use.

File layout: a 64-byte header (magic, version, token count, payload size, CRC-32 of the payload,
the page hash) and the payload, the `[2, layers, page_tokens, kv_heads, head_dim]` KV tensor as
raw bytes. Writes go to a temp file and `os.replace` it, so a reader never sees half a file; a
file that is torn or corrupt anyway (checksum, size or header mismatch) is a miss, counted: it is
deleted (unless another writer replaced it meanwhile) and the prefix recomputed. The folder may be
shared with other models and Jumpgate versions too: each reads and writes only its identity's
subfolder (`model_identity` covers the model, its numerics and the file format `VERSION`), so their
pages are never opened; a page file with our magic but another format version (a version that did
not bump the identity) is a miss that is left in place, never deleted. A failed write
(disk full, ENOSPC) is a logged warning and a miss.

Threads: writes run on one writer thread (the engine only queues a copy of the data), reads on a
small pool (`read_async`, used to prefetch a queued request's pages). The index is guarded by a lock.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
import threading
import time
import zlib
from array import array
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Sequence

import torch

from runtime.kvcache.tiers.shared_folder import remove_abandoned_temps, write_atomically

log = logging.getLogger("jumpgate.hicache")

MAGIC = b"JGKV"
VERSION = 1
_HEADER = struct.Struct("<4sHHIQI32s8x")  # magic, version, reserved, tokens, payload bytes, crc32, hash
assert _HEADER.size == 64  # a multiple of every element size: the payload can be viewed in place
_SUFFIX = ".kv"
SYNC_S = 5.0  # how often a writing process re-reads a (shared) folder


class CorruptPage(Exception):
    def __init__(self, why: str, inode: int):
        super().__init__(why)
        self.inode = inode  # the file that was read: a newer one under the same name is kept


class ForeignPage(Exception):
    """A well-formed page file of another format version: not ours to read, nor to delete."""


# ------------------------------------------------------------------------------ hashing


def model_identity(
    model_dir: str | Path, dtype: torch.dtype, num_layers: int, kv_heads: int, head_dim: int, numerics: str = ""
) -> str:
    """A fingerprint of the model whose KV the pages hold: config, weight files (name, size and
    their first and last MiB), dtype and KV shape. Another model never reads these pages.
    `numerics` names what else decides the KV's bits (the weight format and the attention
    arithmetic, runtime/kvcache/hiradix_cache.py): an fp32 engine must not read a q4 engine's pages, nor
    the vector kernel's the tiles' (layer l's K/V come from layers < l's attention outputs)."""
    model_dir = Path(model_dir)
    h = hashlib.sha256(f"jumpgate-kv-v{VERSION}\0".encode())  # another file format: another folder
    config = model_dir / "config.json"
    if config.exists():
        h.update(config.read_bytes())
    weights = sorted(p for p in model_dir.iterdir() if p.suffix in (".safetensors", ".gguf", ".bin"))
    for p in weights:
        size = p.stat().st_size
        h.update(f"{p.name}\0{size}\0".encode())
        with open(p, "rb") as f:
            h.update(f.read(1 << 20))
            if size > 2 << 20:
                f.seek(size - (1 << 20))
                h.update(f.read(1 << 20))
    h.update(f"{dtype}\0{num_layers}\0{kv_heads}\0{head_dim}\0{numerics}".encode())
    return h.hexdigest()


def chain_seed(identity: str, page_tokens: int, namespace: str) -> bytes:
    return hashlib.sha256(f"{identity}\0{page_tokens}\0{namespace}".encode()).digest()


def chain_hash(prev: bytes, tokens: Sequence[int]) -> bytes:
    return hashlib.sha256(prev + array("I", tokens).tobytes()).digest()


# ------------------------------------------------------------------------------ the store


class DiskStore:
    def __init__(
        self,
        root: str | Path,
        identity: str,
        page_tokens: int,
        num_layers: int,
        kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        max_bytes: int,
        read_workers: int = 2,
        max_pending_bytes: int = 1 << 30,
        sync_s: float = SYNC_S,
    ):
        self.identity = identity
        self.page_tokens = page_tokens
        self.shape = (2, num_layers, page_tokens, kv_heads, head_dim)
        self.dtype = dtype
        self.page_bytes = (
            2 * num_layers * page_tokens * kv_heads * head_dim * torch.empty(0, dtype=dtype).element_size()
        )
        self.max_bytes = max_bytes
        self.max_pending_bytes = max_pending_bytes
        self.sync_s = sync_s
        self.dir = Path(root).expanduser() / identity[:32]
        self.dir.mkdir(parents=True, exist_ok=True)
        self._describe()
        self._lock = threading.Lock()
        self._index: OrderedDict[bytes, int] = OrderedDict()  # page hash -> file size, least recent first
        self._used = 0
        self._pending: dict[bytes, torch.Tensor] = {}  # queued writes: readable before they land
        self._pending_bytes = 0
        # disk_pages_adopted: pages this process did not know of (another process wrote them) found
        # by a lookup; disk_temps_removed: abandoned temp files of dead writers deleted;
        # disk_foreign_pages: page files of another format version met (read as misses, kept)
        self.stats = {
            "disk_pages_written": 0,
            "disk_pages_read": 0,
            "disk_write_errors": 0,
            "disk_writes_dropped": 0,
            "disk_corrupt_pages": 0,
            "disk_pages_evicted": 0,
            "disk_pages_adopted": 0,
            "disk_temps_removed": 0,
            "disk_foreign_pages": 0,
        }
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="jumpgate-kv-write")
        self._readers = ThreadPoolExecutor(read_workers, thread_name_prefix="jumpgate-kv-read")
        self._synced_at = 0.0
        self.sync()

    # -- index ------------------------------------------------------------------------------

    def _describe(self) -> None:
        try:
            info = {
                "identity": self.identity,
                "page_tokens": self.page_tokens,
                "shape": list(self.shape),
                "dtype": str(self.dtype),
                "format": f"{MAGIC.decode()} v{VERSION}",
            }
            write_atomically(self.dir / "identity.json", json.dumps(info, indent=1).encode())
        except OSError:
            pass  # informational only

    def sync(self) -> None:
        """Rebuild the index from the folder, least recently used (oldest mtime) first, and remove
        abandoned temp files. Runs at start and on the writer thread (so never during one of this
        store's own writes)."""
        now = time.time()
        removed = remove_abandoned_temps(self.dir, now)
        found = []
        for entry in os.scandir(self.dir):
            name = entry.name
            if not (name.endswith(_SUFFIX) and len(name) == 64 + len(_SUFFIX)):
                continue
            try:
                st = entry.stat()
                found.append((st.st_mtime, bytes.fromhex(name[:64]), st.st_size))
            except (OSError, ValueError):
                continue  # deleted meanwhile
        found.sort()
        with self._lock:
            self._index = OrderedDict((h, size) for _, h, size in found)
            self._used = sum(size for _, _, size in found)
            self.stats["disk_temps_removed"] += removed
        self._synced_at = time.monotonic()

    def _path(self, h: bytes) -> Path:
        return self.dir / (h.hex() + _SUFFIX)

    @property
    def num_pages(self) -> int:
        return len(self._index)

    @property
    def used_bytes(self) -> int:
        return self._used

    def contains(self, h: bytes) -> bool:
        """Whether page `h` is on disk (or queued): the index, else the folder itself, where another
        process sharing it may have written the page since the last sync."""
        if h in self._index or h in self._pending:
            return True
        try:
            size = os.stat(self._path(h)).st_size
        except OSError:
            return False
        with self._lock:
            if h not in self._index:
                self._index[h] = size
                self._used += size
                self.stats["disk_pages_adopted"] += 1
        return True

    # -- reads ------------------------------------------------------------------------------

    def read(self, h: bytes) -> torch.Tensor | None:
        """The page's KV `[2, L, P, H, D]` on CPU, or None (absent, unreadable or corrupt)."""
        with self._lock:
            pending = self._pending.get(h)
        if pending is not None:
            return pending
        try:
            data = self._read_file(h)
        except FileNotFoundError:
            self._forget(h)
            return None
        except CorruptPage as e:
            self.discard_corrupt(h, str(e), e.inode)
            return None
        except ForeignPage as e:
            log.warning("disk KV cache: page file %s is %s; left in place, treated as a miss", self._path(h).name, e)
            self._forget(h)
            with self._lock:
                self.stats["disk_foreign_pages"] += 1
            return None
        except OSError as e:
            log.warning("disk KV cache: reading page %s failed (%s); treated as a miss", h.hex()[:12], e)
            return None
        with self._lock:
            if h in self._index:
                self._index.move_to_end(h)
            self.stats["disk_pages_read"] += 1
        try:
            os.utime(self._path(h))  # recently used, for every process's next sync
        except OSError:
            pass
        return data

    def read_async(self, h: bytes) -> Future:
        return self._readers.submit(self.read, h)

    def _read_file(self, h: bytes) -> torch.Tensor:
        with open(self._path(h), "rb") as f:
            st = os.fstat(f.fileno())
            size, inode = st.st_size, st.st_ino
            buf = bytearray(size)
            got = f.readinto(buf)
        if got != size or size < _HEADER.size:
            raise CorruptPage(f"truncated file ({got} bytes)", inode)
        magic, version, _, tokens, nbytes, crc, key = _HEADER.unpack_from(buf)
        if magic == MAGIC and version != VERSION:
            raise ForeignPage(f"format version {version}, this server reads {VERSION}")
        if magic != MAGIC:
            raise CorruptPage("bad header", inode)
        if key != h or tokens != self.page_tokens or nbytes != self.page_bytes:
            raise CorruptPage("header does not match the page", inode)
        if size != _HEADER.size + nbytes:
            raise CorruptPage(f"size {size}, expected {_HEADER.size + nbytes} (torn write?)", inode)
        if zlib.crc32(memoryview(buf)[_HEADER.size :]) != crc:
            raise CorruptPage("checksum mismatch", inode)
        flat = torch.frombuffer(buf, dtype=torch.uint8, offset=_HEADER.size, count=nbytes)
        return flat.view(self.dtype).view(self.shape)

    def _forget(self, h: bytes) -> None:
        with self._lock:
            size = self._index.pop(h, None)
            if size is not None:
                self._used -= size

    def discard_corrupt(self, h: bytes, why: str, inode: int) -> None:
        """Drop page `h`, found corrupt in the file with `inode`: out of the index, counted, and that
        file deleted unless another process has renamed a good copy over it meanwhile."""
        log.warning(
            "disk KV cache: page file %s is corrupt (%s); deleted, the prefix will be recomputed",
            self._path(h).name,
            why,
        )
        self._forget(h)
        with self._lock:
            self.stats["disk_corrupt_pages"] += 1
        try:  # only the file that was read: another process may have renamed a good copy over it
            if os.stat(self._path(h)).st_ino == inode:
                os.unlink(self._path(h))
        except OSError:
            pass

    # -- writes -----------------------------------------------------------------------------

    def write(self, h: bytes, data: torch.Tensor, block: bool = False) -> bool:
        """Queue a page for writing (`data` must not change afterwards: pass a copy). Returns False
        if it was dropped because too much is queued already (`block=True` waits instead)."""
        if tuple(data.shape) != self.shape:
            raise ValueError(f"page shape {tuple(data.shape)}, expected {self.shape}")
        with self._lock:
            if h in self._index or h in self._pending:
                return True
            if self._pending_bytes + self.page_bytes > self.max_pending_bytes and not block:
                self.stats["disk_writes_dropped"] += 1
                return False
        if block and self._pending_bytes + self.page_bytes > self.max_pending_bytes:
            self.flush()
        with self._lock:
            self._pending[h] = data
            self._pending_bytes += self.page_bytes
        self._writer.submit(self._write_job, h, data)
        return True

    def _write_job(self, h: bytes, data: torch.Tensor) -> None:
        try:
            if self.page_bytes > self.max_bytes:
                return
            if time.monotonic() - self._synced_at >= self.sync_s:
                self.sync()  # other processes' pages count against the budget, and may be gone
            self.make_room(self.page_bytes)
            size = self.write_page_file(h, data)
        except OSError as e:  # disk full, read-only folder, ...: a miss, never a crash
            log.warning("disk KV cache: writing page %s failed (%s); the page stays uncached", h.hex()[:12], e)
            with self._lock:
                self.stats["disk_write_errors"] += 1
        except Exception:
            log.exception("disk KV cache: writing page %s failed", h.hex()[:12])
            with self._lock:
                self.stats["disk_write_errors"] += 1
        else:
            with self._lock:
                if h not in self._index:  # a lookup may have adopted another process's copy
                    self._used += size
                self._index[h] = size
                self._index.move_to_end(h)
                self.stats["disk_pages_written"] += 1
        finally:
            with self._lock:
                self._pending.pop(h, None)
                self._pending_bytes -= self.page_bytes

    def write_page_file(self, h: bytes, data: torch.Tensor) -> int:
        """Write one page file atomically (temp file + rename); returns its size. Runs on the
        writer thread; an OSError (disk full) is caught by the caller and counted."""
        payload = data.to(self.dtype).contiguous().view(-1).view(torch.uint8).numpy()
        body = memoryview(payload)
        header = _HEADER.pack(MAGIC, VERSION, 0, self.page_tokens, len(body), zlib.crc32(body), h)
        return write_atomically(self._path(h), header, body)

    def make_room(self, size: int) -> None:
        """Delete least recently used pages until `size` more bytes fit the budget. A file another
        process deleted already just leaves the index."""
        while True:
            with self._lock:
                if self._used + size <= self.max_bytes or not self._index:
                    return
                h, old = self._index.popitem(last=False)
                self._used -= old
            try:
                os.unlink(self._path(h))
            except OSError:
                continue
            with self._lock:
                self.stats["disk_pages_evicted"] += 1

    def flush(self) -> None:
        """Wait until every queued write has landed (or failed)."""
        self._writer.submit(lambda: None).result()

    def close(self) -> None:
        self.flush()
        self._readers.shutdown(wait=True, cancel_futures=True)
        self._writer.shutdown(wait=True)
