"""The Files and Batch API's wire objects (OpenAI's shapes), as msgspec Structs."""

from __future__ import annotations

from typing import Any, Literal

from msgspec import Struct, field

FilePurpose = Literal["batch", "batch_output"]
BatchStatus = Literal[
    "validating", "failed", "in_progress", "finalizing", "completed", "expired", "cancelling", "cancelled"
]
FINAL_STATUSES = ("failed", "completed", "expired", "cancelled")


class FileObject(Struct, kw_only=True):
    id: str
    bytes: int
    created_at: int
    filename: str
    purpose: str
    object: str = "file"
    status: str = "processed"
    expires_at: int | None = None
    status_details: str | None = None


class FileDeleted(Struct, kw_only=True):
    id: str
    object: str = "file"
    deleted: bool = True


class BatchError(Struct, kw_only=True):
    code: str
    message: str
    param: str | None = None
    line: int | None = None  # 1-based line of the input file


class BatchErrors(Struct, kw_only=True):
    data: list[BatchError]
    object: str = "list"


class RequestCounts(Struct, kw_only=True):
    total: int = 0
    completed: int = 0
    failed: int = 0


class BatchObject(Struct, kw_only=True):
    id: str
    endpoint: str
    input_file_id: str
    completion_window: str
    status: BatchStatus
    created_at: int
    expires_at: int
    object: str = "batch"
    errors: BatchErrors | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    in_progress_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    request_counts: RequestCounts = field(default_factory=RequestCounts)
    metadata: dict[str, str] | None = None


class BatchCreate(Struct, kw_only=True, forbid_unknown_fields=False):
    input_file_id: str
    endpoint: str
    completion_window: str
    metadata: dict[str, str] | None = None
    output_expires_after: Any = None  # accepted, not enforced (outputs live until deleted)


class Page(Struct, kw_only=True):
    data: list[Any]
    has_more: bool = False
    first_id: str | None = None
    last_id: str | None = None
    object: str = "list"
