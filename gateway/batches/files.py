"""Uploaded and generated files (the Files API), per tenant, on disk.

`<root>/<tenant dir>/<file id>.jsonl` holds the content, `<file id>.json` its `FileObject`, written
atomically after the content: a file is listed and readable only once its record exists, so an
upload cut short or a batch output still being written is never seen. A batch's output and error
files are appended to by the runner (`open_append`) and get their record when the batch ends.
Ids and tenants are checked against strict patterns before they touch a path; another tenant's
id is simply not found.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
import uuid
from pathlib import Path
from typing import BinaryIO

import msgspec

from gateway.batches.objects import FileObject
from gateway.tenant_files import TEMP_PATTERN, tenant_dir, write_atomic
from grammar.service.cache import remove_stale_temp_files

log = logging.getLogger("jumpgate.gateway.files")

FILE_ID_RE = re.compile(r"^file-[0-9a-f]{32}$")
COPY_CHUNK = 1 << 20


def new_file_id() -> str:
    return "file-" + uuid.uuid4().hex


class FileStore:
    def __init__(self, root: str | os.PathLike[str]):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        remove_stale_temp_files(self.root, TEMP_PATTERN)

    def content_path(self, tenant: str, file_id: str) -> Path:
        if not FILE_ID_RE.match(file_id):
            raise ValueError(f"invalid file id {file_id!r}")
        return tenant_dir(self.root, tenant) / f"{file_id}.jsonl"

    def _record_path(self, tenant: str, file_id: str) -> Path:
        return tenant_dir(self.root, tenant) / f"{file_id}.json"

    def create(self, tenant: str, source: BinaryIO, filename: str, purpose: str) -> FileObject:
        """Copy `source` into a new file (blocking I/O: call it from a worker thread)."""
        file_id = new_file_id()
        path = self.content_path(tenant, file_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        size = 0
        with open(path, "wb") as out:
            while chunk := source.read(COPY_CHUNK):
                out.write(chunk)
                size += len(chunk)
            out.flush()
            os.fsync(out.fileno())
        return self.finish(tenant, file_id, filename, purpose, size)

    def finish(self, tenant: str, file_id: str, filename: str, purpose: str, size: int | None = None) -> FileObject:
        """Write the record that makes file `file_id` visible (its content is complete)."""
        path = self.content_path(tenant, file_id)
        if size is None:
            path.touch()
            size = path.stat().st_size
        record = FileObject(id=file_id, bytes=size, created_at=int(time.time()), filename=filename, purpose=purpose)
        write_atomic(self._record_path(tenant, file_id), msgspec.json.encode(record))
        return record

    def get(self, tenant: str, file_id: str) -> FileObject | None:
        if not FILE_ID_RE.match(file_id):
            return None
        path = self._record_path(tenant, file_id)
        try:
            return msgspec.json.decode(path.read_bytes(), type=FileObject)
        except FileNotFoundError:
            return None
        except (msgspec.DecodeError, msgspec.ValidationError, OSError) as e:
            log.warning("files: ignoring damaged record %s (%s)", path, e)
            return None

    def list(self, tenant: str, purpose: str | None = None) -> list[FileObject]:
        """The tenant's files, newest first."""
        folder = tenant_dir(self.root, tenant)
        out = []
        if folder.is_dir():
            for path in folder.glob("file-*.json"):
                record = self.get(tenant, path.stem)
                if record is not None and (purpose is None or record.purpose == purpose):
                    out.append(record)
        out.sort(key=lambda f: (f.created_at, f.id), reverse=True)
        return out

    def delete(self, tenant: str, file_id: str) -> bool:
        if self.get(tenant, file_id) is None:
            return False
        with self._lock:
            for path in (self._record_path(tenant, file_id), self.content_path(tenant, file_id)):
                try:
                    path.unlink()
                except FileNotFoundError:
                    pass
        return True
