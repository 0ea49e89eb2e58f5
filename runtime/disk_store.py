"""The L3 tier: KV pages as files in a cache folder, found again after a restart.

One file per page of `page_tokens` tokens. A page is named by a chained hash:
`h[i] = sha256(h[i-1] + token ids of page i)`, seeded with the model's identity (weights
fingerprint, dtype, layer/head shape, page size) and the cache namespace. So a page file holds the
KV of exactly one token prefix of one model, and a new process finds a prompt's pages by hashing
the prompt page by page and checking which files exist: no index has to survive a restart (the
in-memory index is rebuilt by scanning the folder).

File layout: a 64-byte header (magic, version, token count, payload size, CRC-32 of the payload,
the page hash) and the payload, the `[2, layers, page_tokens, kv_heads, head_dim]` KV tensor as
raw bytes. Writes go to a temp file and `os.replace` it, so a reader never sees half a file; a
file that is torn or corrupt anyway (checksum, size or header mismatch) is a miss: it is deleted
and the prefix recomputed. A failed write (disk full, ENOSPC) is a logged warning and a miss.

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
import zlib
from array import array
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Sequence

import torch

log = logging.getLogger("jumpgate.hicache")

MAGIC = b"JGKV"
VERSION = 1
_HEADER = struct.Struct("<4sHHIQI32s8x")  # magic, version, reserved, tokens, payload bytes, crc32, hash
assert _HEADER.size == 64  # a multiple of every element size: the payload can be viewed in place
_SUFFIX = ".kv"


class CorruptPage(Exception):
    pass


# ------------------------------------------------------------------------------ hashing


def model_identity(model_dir: str | Path, dtype: torch.dtype, num_layers: int, kv_heads: int,
                   head_dim: int) -> str:
    """A fingerprint of the model whose KV the pages hold: config, weight files (name, size and
    their first and last MiB), dtype and KV shape. Another model never reads these pages."""
    model_dir = Path(model_dir)
    h = hashlib.sha256(b"jumpgate-kv-v1\0")
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
    h.update(f"{dtype}\0{num_layers}\0{kv_heads}\0{head_dim}".encode())
    return h.hexdigest()


def chain_seed(identity: str, page_tokens: int, namespace: str) -> bytes:
    return hashlib.sha256(f"{identity}\0{page_tokens}\0{namespace}".encode()).digest()


def chain_hash(prev: bytes, tokens: Sequence[int]) -> bytes:
    return hashlib.sha256(prev + array("I", tokens).tobytes()).digest()


# ------------------------------------------------------------------------------ the store


class DiskStore:
    def __init__(self, root: str | Path, identity: str, page_tokens: int, num_layers: int, kv_heads: int,
                 head_dim: int, dtype: torch.dtype, max_bytes: int, read_workers: int = 2,
                 max_pending_bytes: int = 1 << 30):
        self.identity = identity
        self.page_tokens = page_tokens
        self.shape = (2, num_layers, page_tokens, kv_heads, head_dim)
        self.dtype = dtype
        self.page_bytes = 2 * num_layers * page_tokens * kv_heads * head_dim * torch.empty(0, dtype=dtype).element_size()
        self.max_bytes = max_bytes
        self.max_pending_bytes = max_pending_bytes
        self.dir = Path(root).expanduser() / identity[:32]
        self.dir.mkdir(parents=True, exist_ok=True)
        self._describe()
        self._lock = threading.Lock()
        self._index: OrderedDict[bytes, int] = OrderedDict()  # page hash -> file size, least recent first
        self._used = 0
        self._pending: dict[bytes, torch.Tensor] = {}  # queued writes: readable before they land
        self._pending_bytes = 0
        self.stats = {"disk_pages_written": 0, "disk_pages_read": 0, "disk_write_errors": 0,
                      "disk_writes_dropped": 0, "disk_corrupt_pages": 0, "disk_pages_evicted": 0}
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="jumpgate-kv-write")
        self._readers = ThreadPoolExecutor(read_workers, thread_name_prefix="jumpgate-kv-read")
        self._scan()

    # -- index ------------------------------------------------------------------------------

    def _describe(self) -> None:
        try:
            info = {"identity": self.identity, "page_tokens": self.page_tokens, "shape": list(self.shape),
                    "dtype": str(self.dtype), "format": f"{MAGIC.decode()} v{VERSION}"}
            (self.dir / "identity.json").write_text(json.dumps(info, indent=1))
        except OSError:
            pass  # informational only

    def _scan(self) -> None:
        """Rebuild the index from the folder (oldest first); remove temp files of a crashed writer."""
        found = []
        for entry in os.scandir(self.dir):
            name = entry.name
            try:
                if name.endswith(".tmp"):
                    os.unlink(entry.path)
                elif name.endswith(_SUFFIX) and len(name) == 64 + len(_SUFFIX):
                    st = entry.stat()
                    found.append((st.st_mtime, bytes.fromhex(name[:64]), st.st_size))
            except (OSError, ValueError):
                continue
        for _, h, size in sorted(found):
            self._index[h] = size
            self._used += size

    def _path(self, h: bytes) -> Path:
        return self.dir / (h.hex() + _SUFFIX)

    @property
    def num_pages(self) -> int:
        return len(self._index)

    @property
    def used_bytes(self) -> int:
        return self._used

    def contains(self, h: bytes) -> bool:
        return h in self._index or h in self._pending

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
            self._discard(h, str(e))
            return None
        except OSError as e:
            log.warning("disk KV cache: reading page %s failed (%s); treated as a miss", h.hex()[:12], e)
            return None
        with self._lock:
            if h in self._index:
                self._index.move_to_end(h)
            self.stats["disk_pages_read"] += 1
        return data

    def read_async(self, h: bytes) -> Future:
        return self._readers.submit(self.read, h)

    def _read_file(self, h: bytes) -> torch.Tensor:
        with open(self._path(h), "rb") as f:
            size = os.fstat(f.fileno()).st_size
            buf = bytearray(size)
            got = f.readinto(buf)
        if got != size or size < _HEADER.size:
            raise CorruptPage(f"truncated file ({got} bytes)")
        magic, version, _, tokens, nbytes, crc, key = _HEADER.unpack_from(buf)
        if magic != MAGIC or version != VERSION:
            raise CorruptPage("bad header")
        if key != h or tokens != self.page_tokens or nbytes != self.page_bytes:
            raise CorruptPage("header does not match the page")
        if size != _HEADER.size + nbytes:
            raise CorruptPage(f"size {size}, expected {_HEADER.size + nbytes} (torn write?)")
        if zlib.crc32(memoryview(buf)[_HEADER.size:]) != crc:
            raise CorruptPage("checksum mismatch")
        flat = torch.frombuffer(buf, dtype=torch.uint8, offset=_HEADER.size, count=nbytes)
        return flat.view(self.dtype).view(self.shape)

    def _forget(self, h: bytes) -> None:
        with self._lock:
            size = self._index.pop(h, None)
            if size is not None:
                self._used -= size

    def _discard(self, h: bytes, why: str) -> None:
        log.warning("disk KV cache: page file %s is corrupt (%s); deleted, the prefix will be recomputed",
                    self._path(h).name, why)
        self._forget(h)
        with self._lock:
            self.stats["disk_corrupt_pages"] += 1
        try:
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
            self._make_room(self.page_bytes)
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
                self._index[h] = size
                self._used += size
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
        final = self._path(h)
        tmp = self.dir / f".{h.hex()[:16]}.{os.getpid()}.{threading.get_ident()}.tmp"
        try:
            with open(tmp, "wb") as f:
                f.write(header)
                f.write(body)
            os.replace(tmp, final)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        return _HEADER.size + len(body)

    def _make_room(self, size: int) -> None:
        """Delete least recently used pages until `size` more bytes fit the budget."""
        while True:
            with self._lock:
                if self._used + size <= self.max_bytes or not self._index:
                    return
                h, old = self._index.popitem(last=False)
                self._used -= old
                self.stats["disk_pages_evicted"] += 1
            try:
                os.unlink(self._path(h))
            except OSError:
                pass

    def flush(self) -> None:
        """Wait until every queued write has landed (or failed)."""
        self._writer.submit(lambda: None).result()

    def close(self) -> None:
        self.flush()
        self._readers.shutdown(wait=True, cancel_futures=True)
        self._writer.shutdown(wait=True)
