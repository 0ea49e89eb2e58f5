"""Rules for a cache folder that several processes (engine replicas, maybe on several machines) write
at once: whose temp file is whose, and which ones are safe to delete.

A writer writes `<temp>` then renames it over the final name, so readers never see half a file.
Temp names carry the writer's host, pid and a random suffix, so two writers never share one, and
a cleaner deletes a temp file only when no live writer can still rename it: its writer's process
is gone (same host), or it is older than `STALE_TEMP_S` (any host; a page write takes
milliseconds, so an old temp file is an abandoned one).
"""

from __future__ import annotations

import os
import re
import socket
import uuid
from pathlib import Path

TEMP_SUFFIX = ".tmp"
STALE_TEMP_S = 600.0
_HOST = re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname())[:40] or "host"
_TEMP = re.compile(r"^\.(?P<stem>[^.]*)\.(?P<host>[A-Za-z0-9-]+)\.(?P<pid>\d+)\.[0-9a-f]+\.tmp$")


def temp_name(stem: str) -> str:
    """A temp file name no other writer (process, thread or store) will ever pick."""
    return f".{stem}.{_HOST}.{os.getpid()}.{uuid.uuid4().hex[:12]}{TEMP_SUFFIX}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it exists, under another user
        return True
    return True


def is_abandoned(name: str, mtime: float, now: float) -> bool:
    """True for a temp file whose writer will never rename it (see the module docstring)."""
    if now - mtime > STALE_TEMP_S:
        return True
    m = _TEMP.match(name)
    if m is None or m["host"] != _HOST:
        return False  # another machine's writer (or an unknown name): only age tells
    return not _pid_alive(int(m["pid"]))


def remove_abandoned_temps(folder: Path, now: float) -> int:
    """Delete the abandoned temp files in `folder`; returns how many. Files that vanish meanwhile
    (another cleaner, or the writer's rename) are skipped."""
    removed = 0
    for entry in os.scandir(folder):
        if not entry.name.endswith(TEMP_SUFFIX):
            continue
        try:
            if is_abandoned(entry.name, entry.stat().st_mtime, now):
                os.unlink(entry.path)
                removed += 1
        except OSError:
            continue
    return removed


def write_atomically(path: Path, *parts) -> int:
    """Write `parts` (bytes-like) to `path` through a temp file of this writer's own and a rename;
    returns the bytes written."""
    tmp = path.parent / temp_name(path.name.split(".")[0][:16])
    size = 0
    try:
        with open(tmp, "wb") as f:
            for part in parts:
                size += f.write(part)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return size
