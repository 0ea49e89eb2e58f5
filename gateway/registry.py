"""The schema registry: named, pre-validated JSON schemas, regexes, EBNF grammars and tool sets.

Stored on disk, one JSON file per entry under `<root>/<tenant dir>/<id>.json`, written atomically
(temp file in the same folder + os.replace) so a crash never leaves half a file and a restart sees
every entry. Ids are derived from the canonical JSON of (kind, payload), so uploading the same
schema twice gives the same id. Ids and tenants are validated against strict patterns before they
touch a path, so no id can escape the folder; another tenant's id is simply not found.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import msgspec

from gateway.protocol import SchemaEntry
from grammar.cache import remove_stale_temp_files

log = logging.getLogger("jumpgate.gateway.registry")

ID_RE = re.compile(r"^sch_[0-9a-f]{16,64}$")
_TENANT_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_DEFAULT_TENANT_DIR = "_default"


def schema_id(canonical_text: str) -> str:
    """The id of an entry: a hash of its canonical text (the caller canonicalizes: a schema's
    `properties` order is meaningful, so plain key sorting would merge distinct schemas)."""
    return "sch_" + hashlib.sha256(canonical_text.encode()).hexdigest()[:24]


def valid_id(entry_id: str) -> bool:
    return bool(ID_RE.match(entry_id))


class SchemaRegistry:
    TEMP_PATTERN = "*/.tmp-*.json"  # what `put` writes before its rename

    def __init__(self, root: str | os.PathLike[str]):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        remove_stale_temp_files(self.root, self.TEMP_PATTERN)

    def _tenant_dir(self, tenant: str) -> Path:
        if tenant == "":
            name = _DEFAULT_TENANT_DIR
        elif _TENANT_RE.match(tenant) and tenant != _DEFAULT_TENANT_DIR:
            name = tenant
        else:
            raise ValueError(f"invalid tenant id {tenant!r}")
        return self.root / name

    def _path(self, tenant: str, entry_id: str) -> Path | None:
        if not valid_id(entry_id):
            return None
        return self._tenant_dir(tenant) / f"{entry_id}.json"

    def put(
        self, tenant: str, kind: str, payload: Any, canonical_text: str, name: str | None = None,
        schema_mode: str | None = None,
    ) -> tuple[SchemaEntry, bool]:
        """Store an entry; returns (entry, created). An existing identical entry is returned as is."""
        entry_id = schema_id(canonical_text)
        path = self._path(tenant, entry_id)
        assert path is not None
        with self._lock:
            existing = self._read(path)
            if existing is not None:
                return existing, False
            entry = SchemaEntry(
                id=entry_id, kind=kind, payload=payload, created=int(time.time()), name=name,  # type: ignore[arg-type]
                schema_mode=schema_mode,  # type: ignore[arg-type]
            )
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=path.parent)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(msgspec.json.encode(entry))
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, path)
            except BaseException:
                try:
                    os.unlink(tmp)
                except FileNotFoundError:
                    pass
                raise
            return entry, True

    def get(self, tenant: str, entry_id: str) -> SchemaEntry | None:
        path = self._path(tenant, entry_id)
        return None if path is None else self._read(path)

    def delete(self, tenant: str, entry_id: str) -> bool:
        path = self._path(tenant, entry_id)
        if path is None:
            return False
        with self._lock:
            try:
                path.unlink()
                return True
            except FileNotFoundError:
                return False

    def list(self, tenant: str) -> list[SchemaEntry]:
        folder = self._tenant_dir(tenant)
        if not folder.is_dir():
            return []
        entries = []
        for path in sorted(folder.glob("sch_*.json")):
            if valid_id(path.stem):
                entry = self._read(path)
                if entry is not None:
                    entries.append(entry)
        entries.sort(key=lambda e: (e.created, e.id))
        return entries

    @staticmethod
    def _read(path: Path) -> SchemaEntry | None:
        try:
            return msgspec.json.decode(path.read_bytes(), type=SchemaEntry)
        except FileNotFoundError:
            return None
        except (msgspec.DecodeError, msgspec.ValidationError, OSError) as e:
            # a damaged file reads as absent; a fresh upload rewrites it
            log.warning("schema registry: ignoring damaged entry %s (%s: %s); upload it again to rebuild it",
                        path, type(e).__name__, str(e)[:200])
            return None
