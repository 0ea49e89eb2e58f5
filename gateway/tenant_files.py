"""Per-tenant JSON files on disk (the schema registry, the stored responses): one folder per tenant,
written atomically so a reader never sees half a file and a crash leaves at most a temp file
(`remove_stale_temp_files` clears those at start)."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

TENANT_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
DEFAULT_TENANT_DIR = "_default"  # the tenant "" (no API keys)
TEMP_PATTERN = "*/.tmp-*.json"  # what write_atomic writes before its rename


def tenant_dir(root: Path, tenant: str) -> Path:
    """The tenant's folder under `root`; a tenant id that is not a safe folder name is refused."""
    if tenant == "":
        return root / DEFAULT_TENANT_DIR
    if TENANT_RE.match(tenant) and tenant != DEFAULT_TENANT_DIR:
        return root / tenant
    raise ValueError(f"invalid tenant id {tenant!r}")


def tenant_of(folder: Path) -> str | None:
    """The tenant a folder made by `tenant_dir` belongs to (None: not such a folder)."""
    if folder.name == DEFAULT_TENANT_DIR:
        return ""
    return folder.name if TENANT_RE.match(folder.name) else None


def write_atomic(path: Path, data: bytes, durable: bool = True) -> None:
    """Write `data` to `path` through a temp file and a rename (fsync first when `durable`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
