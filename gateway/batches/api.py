"""What the Files and Batches routes share: the two stores, the runner, the limits; built once per
app (`build_batch_api`) under the gateway's data folder (beside the schema registry)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence, TypeVar

from gateway.batches.answer import LocalCaller
from gateway.batches.files import FileStore
from gateway.batches.metrics import BatchMetrics
from gateway.batches.runner import BatchRunner
from gateway.batches.store import BatchStore
from gateway.errors import bad_request

T = TypeVar("T")
ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/responses")


@dataclass
class BatchAPI:
    files: FileStore
    batches: BatchStore
    runner: BatchRunner
    caller: LocalCaller
    file_max_bytes: int


def build_batch_api(data_root: Path, settings: Any, registry: Any) -> BatchAPI:
    """`data_root`: the folder holding `files/` and `batches/`; `registry`: the gateway's Prometheus registry."""
    files = FileStore(data_root / "files")
    batches = BatchStore(data_root / "batches")
    caller = LocalCaller()
    metrics = BatchMetrics(registry, lambda: [b.batch.status for b in batches.all()]) if registry is not None else None
    runner = BatchRunner(
        batches,
        files,
        caller,
        metrics,
        concurrency=settings.batch_concurrency,
        max_requests=settings.batch_max_requests,
    )
    return BatchAPI(files, batches, runner, caller, settings.batch_file_max_bytes)


def paginate(items: Sequence[T], after: str | None, limit: int, max_limit: int = 100) -> tuple[list[T], bool]:
    """The page after the item with id `after` (OpenAI's cursor pagination), and whether more follow."""
    if not 1 <= limit <= max_limit:
        raise bad_request(f"'limit' must be between 1 and {max_limit}.", "limit")
    start = 0
    if after:
        ids = [x.id for x in items]  # type: ignore[attr-defined]
        if after not in ids:
            raise bad_request(f"'after' names no item of this list: {after!r}.", "after")
        start = ids.index(after) + 1
    page = list(items[start : start + limit])
    return page, start + limit < len(items)
