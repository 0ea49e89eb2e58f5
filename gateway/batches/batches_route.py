"""/v1/batches: create a batch from an uploaded file, list, retrieve, cancel (the Batch API); the
work itself is the background runner's (gateway/batches/runner.py)."""

from __future__ import annotations

import time

from litestar import Controller, get, post
from litestar.di import NamedDependency
from litestar.params import FromPath, FromQuery, JSONBody

from gateway.batches.api import ENDPOINTS, BatchAPI, paginate
from gateway.batches.objects import FINAL_STATUSES, BatchCreate, BatchObject, Page
from gateway.batches.store import InvalidTransition, new_batch_id
from gateway.errors import APIError, bad_request, not_found

COMPLETION_WINDOW_S = {"24h": 24 * 3600}
MAX_METADATA_PAIRS = 16


def batch_not_found(batch_id: str) -> APIError:
    return not_found(f"No such Batch object: {batch_id}", "batch_id", code="batch_not_found")


class BatchesController(Controller):
    path = "/batches"
    tags = ["batches"]

    @post("", status_code=200, summary="Create a batch")
    async def create(
        self, data: JSONBody[BatchCreate], batch_api: NamedDependency[BatchAPI], tenant: NamedDependency[str]
    ) -> BatchObject:
        if data.endpoint not in ENDPOINTS:
            raise bad_request(
                f"Invalid value for 'endpoint': {data.endpoint!r}; this server runs batches for "
                f"{', '.join(ENDPOINTS)}.",
                "endpoint",
                code="invalid_endpoint",
            )
        window = COMPLETION_WINDOW_S.get(data.completion_window)
        if window is None:
            raise bad_request(
                f"Invalid value for 'completion_window': {data.completion_window!r}; only '24h' is supported.",
                "completion_window",
            )
        if data.metadata is not None and len(data.metadata) > MAX_METADATA_PAIRS:
            raise bad_request(f"'metadata' holds at most {MAX_METADATA_PAIRS} pairs.", "metadata")
        record = batch_api.files.get(tenant, data.input_file_id)
        if record is None:
            raise not_found(f"No such File object: {data.input_file_id}", "input_file_id", code="file_not_found")
        if record.purpose != "batch":
            raise bad_request(
                f"The input file {data.input_file_id} has purpose {record.purpose!r}; a batch's "
                "input file must be uploaded with purpose 'batch'.",
                "input_file_id",
                code="invalid_file_purpose",
            )
        now = int(time.time())
        batch = BatchObject(
            id=new_batch_id(),
            endpoint=data.endpoint,
            input_file_id=data.input_file_id,
            completion_window=data.completion_window,
            status="validating",
            created_at=now,
            expires_at=now + window,
            metadata=data.metadata,
        )
        batch_api.batches.add(tenant, batch)
        batch_api.runner.wake()
        return batch

    @get("", summary="List batches")
    async def list_batches(
        self,
        batch_api: NamedDependency[BatchAPI],
        tenant: NamedDependency[str],
        after: FromQuery[str | None] = None,
        limit: FromQuery[int] = 20,
    ) -> Page:
        page, more = paginate(batch_api.batches.list(tenant), after, limit)
        return Page(
            data=page, has_more=more, first_id=page[0].id if page else None, last_id=page[-1].id if page else None
        )

    @get("/{batch_id:str}", summary="Retrieve a batch")
    async def retrieve(
        self, batch_id: FromPath[str], batch_api: NamedDependency[BatchAPI], tenant: NamedDependency[str]
    ) -> BatchObject:
        batch = batch_api.batches.get(tenant, batch_id)
        if batch is None:
            raise batch_not_found(batch_id)
        return batch

    @post("/{batch_id:str}/cancel", status_code=200, summary="Cancel a batch")
    async def cancel(
        self, batch_id: FromPath[str], batch_api: NamedDependency[BatchAPI], tenant: NamedDependency[str]
    ) -> BatchObject:
        batch = batch_api.batches.get(tenant, batch_id)
        if batch is None:
            raise batch_not_found(batch_id)
        if batch.status in ("cancelling", "cancelled"):
            return batch
        try:
            if batch.status in FINAL_STATUSES:
                raise InvalidTransition
            batch_api.batches.transition(tenant, batch, "cancelling")
        except InvalidTransition:
            raise APIError(
                409,
                f"Cannot cancel a batch with status {batch.status!r}.",
                param="batch_id",
                code="batch_not_cancellable",
            ) from None
        batch_api.runner.wake()
        return batch
