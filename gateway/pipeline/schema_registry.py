"""The schema registry: named, pre-validated JSON schemas, regexes, EBNF grammars and tool sets.

Stored on disk, one JSON file per entry under `<root>/<tenant dir>/<id>.json`, written atomically
(temp file in the same folder + os.replace) so a crash never leaves half a file and a restart sees
every entry. Ids are derived from the canonical JSON of (kind, payload), so uploading the same
schema twice gives the same id. Ids and tenants are validated against strict patterns before they
touch a path, so no id can escape the folder; another tenant's id is simply not found.

A pinned entry (uploaded with `"pin": true`) also has `<id>.pin.json` beside it, holding the system
prompt it was pinned with, so the server re-applies its pins at start (`pinned()`).

Entries belong to no model, so servers of several models share the folder. A file that is not
whole JSON is damaged (writes are atomic, so only outside damage makes one): it reads as absent and
an upload of the same entry rewrites it. A whole JSON entry this version cannot read was written by
another Jumpgate version: it reads as absent here, and is never overwritten (`ForeignEntry`).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import threading
import time
from pathlib import Path
from typing import Any, Literal

import msgspec
from msgspec import UNSET, Struct, UnsetType

from gateway.protocol import SchemaMode
from gateway.tenant_files import TEMP_PATTERN, tenant_dir, tenant_of, write_atomic
from grammar.service.cache import remove_stale_temp_files

log = logging.getLogger("jumpgate.gateway.registry")

ID_RE = re.compile(r"^sch_[0-9a-f]{16,64}$")
_PIN_SUFFIX = ".pin.json"


class SchemaEntry(Struct, kw_only=True):
    id: str
    kind: Literal["json_schema", "regex", "ebnf", "tools"]
    payload: Any  # the schema dict, the regex/EBNF string, or the list of tool dicts
    created: int
    name: str | None = None
    object: Literal["schema"] = "schema"
    pinned_tokens: int | None = None  # set in the response of an upload with "pin": true
    schema_mode: SchemaMode | None = None  # requests with this schema_id default to it
    fidelity: dict[str, Any] | UnsetType = UNSET  # set in the response of an upload (schemas and tools)


class ForeignEntry(Exception):
    """The entry's file holds an entry this version cannot read, written by another version."""

    def __init__(self, entry_id: str):
        super().__init__(entry_id)
        self.entry_id = entry_id


class PinRecord(msgspec.Struct, kw_only=True):
    """What re-pinning an entry needs besides the entry: the system prompt its prefix starts with."""

    system_prompt: str | None = None


class PinnedEntry(msgspec.Struct, kw_only=True):
    tenant: str
    entry: SchemaEntry
    system_prompt: str | None


def schema_id(canonical_text: str) -> str:
    """The id of an entry: a hash of its canonical text (the caller canonicalizes: a schema's
    `properties` order is meaningful, so plain key sorting would merge distinct schemas)."""
    return "sch_" + hashlib.sha256(canonical_text.encode()).hexdigest()[:24]


def valid_id(entry_id: str) -> bool:
    return bool(ID_RE.match(entry_id))


class SchemaRegistry:
    TEMP_PATTERN = TEMP_PATTERN  # what `put` writes before its rename

    def __init__(self, root: str | os.PathLike[str]):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        remove_stale_temp_files(self.root, self.TEMP_PATTERN)

    def _tenant_dir(self, tenant: str) -> Path:
        return tenant_dir(self.root, tenant)

    def _path(self, tenant: str, entry_id: str) -> Path | None:
        if not valid_id(entry_id):
            return None
        return self._tenant_dir(tenant) / f"{entry_id}.json"

    @staticmethod
    def _pin_path(entry_path: Path) -> Path:
        return entry_path.with_name(entry_path.stem + _PIN_SUFFIX)

    @staticmethod
    def _write_atomic(path: Path, data: bytes) -> None:
        write_atomic(path, data)

    def put(
        self,
        tenant: str,
        kind: str,
        payload: Any,
        canonical_text: str,
        name: str | None = None,
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
            if self._foreign(path):
                raise ForeignEntry(entry_id)
            entry = SchemaEntry(
                id=entry_id,
                kind=kind,
                payload=payload,
                created=int(time.time()),
                name=name,  # type: ignore[arg-type]
                schema_mode=schema_mode,  # type: ignore[arg-type]
            )
            self._write_atomic(path, msgspec.json.encode(entry))
            return entry, True

    def set_pin(self, tenant: str, entry_id: str, system_prompt: str | None) -> bool:
        """Record that the entry is pinned (with this system prompt; the latest pin replaces an
        earlier one, as in the engine). False if there is no such entry."""
        path = self._path(tenant, entry_id)
        if path is None:
            return False
        with self._lock:
            if not path.exists():
                return False
            self._write_atomic(self._pin_path(path), msgspec.json.encode(PinRecord(system_prompt=system_prompt)))
            return True

    def pinned(self) -> list[PinnedEntry]:
        """Every pinned entry of every tenant, oldest pin first (the order they are re-applied in)."""
        found = []
        for pin_path in self.root.glob(f"*/sch_*{_PIN_SUFFIX}"):
            tenant = tenant_of(pin_path.parent)
            entry_id = pin_path.name[: -len(_PIN_SUFFIX)]
            if not valid_id(entry_id) or tenant is None:
                continue
            try:
                record = msgspec.json.decode(pin_path.read_bytes(), type=PinRecord)
                when = pin_path.stat().st_mtime_ns
            except FileNotFoundError:
                continue
            except (msgspec.DecodeError, msgspec.ValidationError, OSError) as e:
                log.warning("schema registry: ignoring damaged pin record %s (%s)", pin_path, e)
                continue
            entry = self.get(tenant, entry_id)
            if entry is not None:
                found.append(
                    (when, entry_id, PinnedEntry(tenant=tenant, entry=entry, system_prompt=record.system_prompt))
                )
        return [pinned for *_, pinned in sorted(found, key=lambda f: (f[0], f[1]))]

    def get(self, tenant: str, entry_id: str) -> SchemaEntry | None:
        path = self._path(tenant, entry_id)
        return None if path is None else self._read(path)

    def delete(self, tenant: str, entry_id: str) -> bool:
        path = self._path(tenant, entry_id)
        if path is None:
            return False
        with self._lock:
            try:
                self._pin_path(path).unlink()
            except FileNotFoundError:
                pass
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
    def _foreign(path: Path) -> bool:
        """Whether `path` holds whole JSON (so not a damaged file) that `_read` refused."""
        try:
            return isinstance(msgspec.json.decode(path.read_bytes()), dict)
        except (msgspec.DecodeError, OSError):
            return False

    @staticmethod
    def _read(path: Path) -> SchemaEntry | None:
        try:
            return msgspec.json.decode(path.read_bytes(), type=SchemaEntry)
        except FileNotFoundError:
            return None
        except msgspec.ValidationError as e:  # whole JSON, another version's entry: kept as it is
            log.warning(
                "schema registry: skipping entry %s, which another Jumpgate version wrote (%s)", path, str(e)[:200]
            )
            return None
        except (msgspec.DecodeError, OSError) as e:
            # a damaged file reads as absent; a fresh upload rewrites it
            log.warning(
                "schema registry: ignoring damaged entry %s (%s: %s); upload it again to rebuild it",
                path,
                type(e).__name__,
                str(e)[:200],
            )
            return None
