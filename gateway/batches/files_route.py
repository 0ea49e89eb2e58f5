"""/v1/files: upload (multipart, purpose `batch`), list, retrieve, delete, and read a file's content
(uploads and the Batch API's output and error files), per tenant."""

from __future__ import annotations

from typing import Any

import anyio
from litestar import Controller, Request, Response, delete, get, post
from litestar.datastructures import UploadFile
from litestar.di import NamedDependency
from litestar.params import FromPath, FromQuery

from gateway.batches.api import BatchAPI, paginate
from gateway.batches.objects import FileDeleted, FileObject, Page
from gateway.errors import APIError, bad_request, not_found

MULTIPART_SLACK = 64 * 1024  # the form's boundaries and headers around the file itself
UPLOAD_PURPOSES = ("batch",)


def too_large(limit: int) -> APIError:
    return APIError(
        413,
        f"The file is larger than this server's limit of {limit} bytes (--batch-file-max-bytes).",
        param="file",
        code="file_too_large",
    )


def file_not_found(file_id: str) -> APIError:
    return not_found(f"No such File object: {file_id}", "file_id", code="file_not_found")


def files_controller(max_bytes: int) -> type[Controller]:
    """The controller, with the body limit of its upload route set from --batch-file-max-bytes."""

    class FilesController(Controller):
        path = "/files"
        tags = ["files"]

        @post(
            "",
            status_code=200,
            summary="Upload a file (JSONL, purpose batch)",
            request_max_body_size=max_bytes + MULTIPART_SLACK,
        )
        async def create(
            self, request: Request[Any, Any, Any], batch_api: NamedDependency[BatchAPI], tenant: NamedDependency[str]
        ) -> FileObject:
            limit = batch_api.file_max_bytes
            length = request.headers.get("content-length")
            if length and length.isdigit() and int(length) > limit + MULTIPART_SLACK:
                raise too_large(limit)  # before reading a byte of it
            if not request.headers.get("content-type", "").startswith("multipart/form-data"):
                raise bad_request(
                    "Upload the file as multipart/form-data with the fields 'file' and 'purpose'.", "file"
                )
            form = await request.form()
            purpose = form.get("purpose")
            upload = form.get("file")
            if not isinstance(purpose, str) or not purpose:
                raise bad_request("Missing required parameter: 'purpose'.", "purpose")
            if purpose not in UPLOAD_PURPOSES:
                raise bad_request(
                    f"Invalid value for 'purpose': {purpose!r}; this server accepts "
                    f"{', '.join(map(repr, UPLOAD_PURPOSES))}.",
                    "purpose",
                    code="invalid_purpose",
                )
            if not isinstance(upload, UploadFile):
                raise bad_request("Missing required parameter: 'file' (a file part of the form).", "file")
            try:
                size = await anyio.to_thread.run_sync(lambda: upload.file.seek(0, 2))
                if size > limit:
                    raise too_large(limit)
                if size == 0:
                    raise bad_request("The file is empty.", "file", code="empty_file")
                await upload.seek(0)
                return await anyio.to_thread.run_sync(
                    batch_api.files.create, tenant, upload.file, upload.filename or "upload.jsonl", purpose
                )
            finally:
                await upload.close()

        @get("", summary="List files")
        async def list_files(
            self,
            batch_api: NamedDependency[BatchAPI],
            tenant: NamedDependency[str],
            purpose: FromQuery[str | None] = None,
            after: FromQuery[str | None] = None,
            limit: FromQuery[int] = 10000,
            order: FromQuery[str] = "desc",
        ) -> Page:
            if order not in ("asc", "desc"):
                raise bad_request("'order' must be 'asc' or 'desc'.", "order")
            files = await anyio.to_thread.run_sync(batch_api.files.list, tenant, purpose)
            if order == "asc":
                files.reverse()
            page, more = paginate(files, after, limit, max_limit=10000)
            return Page(
                data=page, has_more=more, first_id=page[0].id if page else None, last_id=page[-1].id if page else None
            )

        @get("/{file_id:str}", summary="Retrieve a file")
        async def retrieve(
            self, file_id: FromPath[str], batch_api: NamedDependency[BatchAPI], tenant: NamedDependency[str]
        ) -> FileObject:
            record = batch_api.files.get(tenant, file_id)
            if record is None:
                raise file_not_found(file_id)
            return record

        @delete("/{file_id:str}", status_code=200, summary="Delete a file")
        async def remove(
            self, file_id: FromPath[str], batch_api: NamedDependency[BatchAPI], tenant: NamedDependency[str]
        ) -> FileDeleted:
            if not await anyio.to_thread.run_sync(batch_api.files.delete, tenant, file_id):
                raise file_not_found(file_id)
            return FileDeleted(id=file_id)

        @get("/{file_id:str}/content", summary="Read a file's content", media_type="application/octet-stream")
        async def content(
            self, file_id: FromPath[str], batch_api: NamedDependency[BatchAPI], tenant: NamedDependency[str]
        ) -> Response[bytes]:
            if batch_api.files.get(tenant, file_id) is None:
                raise file_not_found(file_id)
            try:
                data = await anyio.to_thread.run_sync(batch_api.files.content_path(tenant, file_id).read_bytes)
            except FileNotFoundError:
                raise file_not_found(file_id) from None
            return Response(data, media_type="application/octet-stream")

    return FilesController
