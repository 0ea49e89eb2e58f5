"""Batches and their state machine, per tenant, persisted atomically.

validating → in_progress → finalizing → completed; validating → failed (a bad input file);
validating / in_progress → cancelling → cancelled; in_progress → expired (past the completion
window). Each batch is one JSON file `<root>/<tenant dir>/<batch id>.json` (temp file + rename),
read once at start; the store keeps them in memory and writes every change through. Progress
(`request_counts`) is written without fsync, state changes with it: the runner recovers the
true counts from the output and error files anyway.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
import uuid
from pathlib import Path

import msgspec
from msgspec import Struct

from gateway.batches.objects import FINAL_STATUSES, BatchObject
from gateway.tenant_files import TEMP_PATTERN, tenant_dir, tenant_of, write_atomic
from grammar.service.cache import remove_stale_temp_files

log = logging.getLogger("jumpgate.gateway.batches")

BATCH_ID_RE = re.compile(r"^batch_[0-9a-f]{32}$")
TRANSITIONS = {
    "validating": ("in_progress", "failed", "cancelling"),
    "in_progress": ("finalizing", "cancelling", "expired"),
    "finalizing": ("completed",),
    "cancelling": ("cancelled",),
}


class InvalidTransition(Exception):
    pass


def new_batch_id() -> str:
    return "batch_" + uuid.uuid4().hex


class StoredBatch(Struct, kw_only=True):
    tenant: str
    batch: BatchObject


class BatchStore:
    def __init__(self, root: str | os.PathLike[str]):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        remove_stale_temp_files(self.root, TEMP_PATTERN)
        self._batches: dict[str, StoredBatch] = {}
        for folder in self.root.iterdir():
            if folder.is_dir() and tenant_of(folder) is not None:
                for path in folder.glob("batch_*.json"):
                    self._load(path)

    def _load(self, path: Path) -> None:
        try:
            stored = msgspec.json.decode(path.read_bytes(), type=StoredBatch)
        except (msgspec.DecodeError, msgspec.ValidationError, OSError) as e:
            log.warning("batches: ignoring damaged record %s (%s)", path, e)
            return
        if BATCH_ID_RE.match(stored.batch.id) and tenant_dir(self.root, stored.tenant) == path.parent:
            self._batches[stored.batch.id] = stored

    def _write(self, stored: StoredBatch, durable: bool) -> None:
        path = tenant_dir(self.root, stored.tenant) / f"{stored.batch.id}.json"
        write_atomic(path, msgspec.json.encode(stored), durable=durable)

    def add(self, tenant: str, batch: BatchObject) -> None:
        stored = StoredBatch(tenant=tenant, batch=batch)
        with self._lock:
            self._write(stored, durable=True)
            self._batches[batch.id] = stored

    def get(self, tenant: str, batch_id: str) -> BatchObject | None:
        stored = self._batches.get(batch_id)
        return stored.batch if stored is not None and stored.tenant == tenant else None

    def list(self, tenant: str) -> list[BatchObject]:
        """The tenant's batches, newest first."""
        batches = [s.batch for s in list(self._batches.values()) if s.tenant == tenant]
        return sorted(batches, key=lambda b: (b.created_at, b.id), reverse=True)

    def all(self) -> list[StoredBatch]:
        return list(self._batches.values())

    def unfinished(self) -> list[StoredBatch]:
        """Batches the runner still has work on, oldest first."""
        return sorted(
            (s for s in list(self._batches.values()) if s.batch.status not in FINAL_STATUSES),
            key=lambda s: (s.batch.created_at, s.batch.id),
        )

    def save(self, tenant: str, batch: BatchObject, durable: bool = False) -> None:
        with self._lock:
            self._write(StoredBatch(tenant=tenant, batch=batch), durable)

    def transition(self, tenant: str, batch: BatchObject, status: str) -> None:
        """Move `batch` to `status` (stamping `<status>_at`) and persist it durably."""
        with self._lock:
            if status not in TRANSITIONS.get(batch.status, ()):
                raise InvalidTransition(f"a batch cannot go from {batch.status} to {status}")
            batch.status = status  # type: ignore[assignment]
            setattr(batch, f"{status}_at", int(time.time()))
            self._write(StoredBatch(tenant=tenant, batch=batch), durable=True)
