"""Stored responses (`store: true`), per tenant, on disk, bounded by count and bytes.

One JSON file per response under `<root>/<tenant dir>/<id>.json`, written atomically (temp file in
the same folder + os.replace, as the schema registry does). Besides the response body a record
keeps what a `previous_response_id` chain needs to extend the exact token prefix the radix cache
holds: the conversation as chat messages, the prompt text and ids, and the generated ids.

Each tenant keeps at most `max_count` records and `max_bytes` bytes; the oldest go first. Ids and
tenants are checked against strict patterns before they touch a path; another tenant's id is
simply not found.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import uuid
from collections import OrderedDict
from pathlib import Path

import msgspec
from msgspec import Struct

from gateway.protocol import Message
from gateway.responses.protocol import ResponseObject
from gateway.tenant_files import TEMP_PATTERN, tenant_dir, write_atomic
from grammar.service.cache import remove_stale_temp_files

log = logging.getLogger("jumpgate.gateway.responses")

ID_RE = re.compile(r"^resp_[0-9a-f]{32}$")


def new_response_id() -> str:
    return "resp_" + uuid.uuid4().hex


class StoredTurn(Struct, kw_only=True):
    """What the next turn of a chain renders from (see `PromptRenderer.render_continuation`)."""

    messages: list[Message]  # the conversation through this response's assistant turn (no instructions)
    prompt_text: str  # the template text of this response's prompt
    prompt_ids: list[int]  # the exact ids the engine ran
    output_text: str  # the generated text, raw (tool calls in the model's format)
    output_ids: list[int]  # the generated ids, a stop token included
    # the fingerprint of the tokenizer the ids belong to: the store may be shared by servers of other
    # models, whose next turn then renders the messages afresh instead of splicing foreign ids
    tokenizer: str = ""


class StoredResponse(Struct, kw_only=True):
    response: ResponseObject
    turn: StoredTurn


class ResponseStore:
    TEMP_PATTERN = TEMP_PATTERN

    def __init__(self, root: str | os.PathLike[str], max_count: int, max_bytes: int):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.max_count = max_count
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._index: dict[str, OrderedDict[str, int]] = {}  # tenant dir -> id -> bytes, oldest first
        remove_stale_temp_files(self.root, self.TEMP_PATTERN)

    def _tenant_dir(self, tenant: str) -> Path:
        return tenant_dir(self.root, tenant)

    def _tenant_index(self, folder: Path) -> OrderedDict[str, int]:
        """The tenant's records, oldest first (read from disk once per process)."""
        index = self._index.get(folder.name)
        if index is None:
            files = []
            if folder.is_dir():
                for path in folder.glob("resp_*.json"):
                    if ID_RE.match(path.stem):
                        stat = path.stat()
                        files.append((stat.st_mtime_ns, path.stem, stat.st_size))
            index = OrderedDict((rid, size) for _, rid, size in sorted(files))
            self._index[folder.name] = index
        return index

    def put(self, tenant: str, record: StoredResponse) -> None:
        folder = self._tenant_dir(tenant)
        rid = record.response.id
        assert ID_RE.match(rid), rid
        data = msgspec.json.encode(record)
        with self._lock:
            folder.mkdir(parents=True, exist_ok=True)
            index = self._tenant_index(folder)
            write_atomic(folder / f"{rid}.json", data, durable=False)
            index[rid] = len(data)
            index.move_to_end(rid)
            self._evict(folder, index)

    def _evict(self, folder: Path, index: OrderedDict[str, int]) -> None:
        total = sum(index.values())
        while index and (len(index) > self.max_count or total > self.max_bytes):
            rid, size = index.popitem(last=False)
            total -= size
            try:
                (folder / f"{rid}.json").unlink()
            except FileNotFoundError:
                pass

    def get(self, tenant: str, rid: str) -> StoredResponse | None:
        if not ID_RE.match(rid):
            return None
        path = self._tenant_dir(tenant) / f"{rid}.json"
        try:
            return msgspec.json.decode(path.read_bytes(), type=StoredResponse)
        except FileNotFoundError:
            return None
        except (msgspec.DecodeError, msgspec.ValidationError, OSError) as e:
            log.warning("response store: ignoring damaged record %s (%s: %s)", path, type(e).__name__, str(e)[:200])
            return None

    def delete(self, tenant: str, rid: str) -> bool:
        if not ID_RE.match(rid):
            return False
        folder = self._tenant_dir(tenant)
        with self._lock:
            self._tenant_index(folder).pop(rid, None)
            try:
                (folder / f"{rid}.json").unlink()
                return True
            except FileNotFoundError:
                return False
