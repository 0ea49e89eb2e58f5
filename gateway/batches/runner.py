"""The background task that works through unfinished batches, oldest first, one batch at a time.

A batch's lines run in prefix-grouped order (`lines.run_order`) with at most `concurrency` in
flight, each answered by an in-process request at the engine's background priority
(`answer.LocalCaller`), so online requests are admitted first whenever both wait. Every answer is
appended to the output file (2xx) or the error file as one whole line and flushed at once; the
set of answered custom_ids is what those files hold, so after a restart (or a kill) the batch
resumes with the lines not in either file and no line is ever answered twice. A torn last line
(a kill mid-write) is cut off first: that line runs again. One process runs batches per data
folder (an exclusive flock), so replicas sharing the folder never answer the same batch.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import time
import uuid
from pathlib import Path
from typing import Any, BinaryIO

import msgspec

from gateway.batches.answer import LocalCaller
from gateway.batches.files import FileStore, new_file_id
from gateway.batches.lines import BatchLine, parse_lines, run_order
from gateway.batches.metrics import BatchMetrics
from gateway.batches.objects import BatchErrors, BatchObject
from gateway.batches.store import BatchStore, StoredBatch

log = logging.getLogger("jumpgate.gateway.batches")

OVERLOADED_RETRY_S = 0.5  # a line refused with 503 (the gateway or engine queue full) waits and runs again
IDLE_POLL_S = 1.0
CANCEL_POLL_S = 0.2


class _Answered(msgspec.Struct):
    custom_id: str


def recover_answered(path: Path) -> set[str]:
    """The custom_ids of the whole lines of an output or error file; a torn last line is cut off."""
    if not path.exists():
        return set()
    data = path.read_bytes()
    whole = data.rfind(b"\n") + 1
    if whole < len(data):
        with open(path, "r+b") as f:
            f.truncate(whole)
    ids = set()
    for raw in data[:whole].splitlines():
        try:
            ids.add(msgspec.json.decode(raw, type=_Answered).custom_id)
        except (msgspec.DecodeError, msgspec.ValidationError):
            log.warning("batch file %s: skipping an unreadable line", path)
    return ids


def result_line(line: BatchLine, status: int, body: bytes) -> bytes:
    """OpenAI's output/error line: the answer as the online route gave it, status and body."""
    try:
        request_id = msgspec.json.decode(body, type=dict).get("id")
        payload: Any = msgspec.Raw(body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        request_id, payload = None, body.decode(errors="replace")
    request_id = request_id if isinstance(request_id, str) else "req_" + uuid.uuid4().hex
    return (
        msgspec.json.encode(
            {
                "id": "batch_req_" + uuid.uuid4().hex,
                "custom_id": line.custom_id,
                "response": {"status_code": status, "request_id": request_id, "body": payload},
                "error": None,
            }
        )
        + b"\n"
    )


class BatchRunner:
    def __init__(
        self,
        store: BatchStore,
        files: FileStore,
        caller: LocalCaller,
        metrics: BatchMetrics | None,
        *,
        concurrency: int,
        max_requests: int,
    ):
        self.store = store
        self.files = files
        self.caller = caller
        self.metrics = metrics
        self.concurrency = concurrency
        self.max_requests = max_requests
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._lock_file: BinaryIO | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        self._wake = asyncio.Event()  # bound to the running loop
        self._task = asyncio.create_task(self._loop(), name="jumpgate-batch-runner")

    async def stop(self) -> None:
        """Cancel the work in flight (its engine requests are aborted; those lines run again later)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        if self._lock_file is not None:
            self._lock_file.close()
            self._lock_file = None

    def wake(self) -> None:
        self._wake.set()

    def _owns_folder(self) -> bool:
        if self._lock_file is None:
            f = open(self.store.root / ".runner.lock", "a+b")
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                f.close()
                return False
            self._lock_file = f
        return True

    async def _loop(self) -> None:
        while True:
            try:
                work = self.store.unfinished() if self._owns_folder() else []
                for stored in work:
                    await self._advance(stored)
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug must not end batch processing for the server's life
                log.exception("batch runner failed; retrying")
                await asyncio.sleep(IDLE_POLL_S)
            if not self.store.unfinished():
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), IDLE_POLL_S)
                except TimeoutError:
                    pass

    # ------------------------------------------------------------------ one batch

    async def _advance(self, stored: StoredBatch) -> None:
        tenant, batch = stored.tenant, stored.batch
        if batch.status == "validating":
            await self._validate(tenant, batch)
        if batch.status == "in_progress":
            await self._run(tenant, batch)
            if batch.status == "in_progress":
                counts = batch.request_counts
                if time.time() < batch.expires_at and counts.completed + counts.failed < counts.total:
                    return  # a line went unanswered: the next round runs what the files lack
                if time.time() >= batch.expires_at:
                    self.store.transition(tenant, batch, "expired")
                    await asyncio.to_thread(self._finish_files, tenant, batch)
                    return
                self.store.transition(tenant, batch, "finalizing")
        if batch.status == "finalizing":
            await asyncio.to_thread(self._finish_files, tenant, batch)
            self.store.transition(tenant, batch, "completed")
        if batch.status == "cancelling":
            await asyncio.to_thread(self._finish_files, tenant, batch)
            self.store.transition(tenant, batch, "cancelled")

    async def _read_lines(self, tenant: str, batch: BatchObject) -> tuple[list[BatchLine], BatchErrors | None]:
        from gateway.batches.objects import BatchError

        if self.files.get(tenant, batch.input_file_id) is None:
            return [], BatchErrors(
                data=[
                    BatchError(
                        code="file_not_found",
                        param="input_file_id",
                        message=f"The input file {batch.input_file_id} was deleted.",
                    )
                ]
            )
        data = await asyncio.to_thread(self.files.content_path(tenant, batch.input_file_id).read_bytes)
        lines, errors = await asyncio.to_thread(parse_lines, data, batch.endpoint, self.max_requests)
        return lines, BatchErrors(data=errors) if errors else None

    async def _validate(self, tenant: str, batch: BatchObject) -> None:
        lines, errors = await self._read_lines(tenant, batch)
        if batch.status != "validating":  # cancelled meanwhile
            return
        if errors is not None:
            batch.errors = errors
            self.store.transition(tenant, batch, "failed")
            return
        batch.request_counts.total = len(lines)
        batch.output_file_id, batch.error_file_id = new_file_id(), new_file_id()
        self.store.transition(tenant, batch, "in_progress")

    def _paths(self, tenant: str, batch: BatchObject) -> tuple[Path, Path]:
        assert batch.output_file_id and batch.error_file_id
        return (
            self.files.content_path(tenant, batch.output_file_id),
            self.files.content_path(tenant, batch.error_file_id),
        )

    async def _run(self, tenant: str, batch: BatchObject) -> None:
        lines, errors = await self._read_lines(tenant, batch)
        if errors is not None:  # the input file went away after validation
            batch.errors = errors
            self.store.transition(tenant, batch, "cancelling")
            return
        out_path, err_path = self._paths(tenant, batch)
        out_path.parent.mkdir(parents=True, exist_ok=True)
        done_ok = await asyncio.to_thread(recover_answered, out_path)
        done_err = await asyncio.to_thread(recover_answered, err_path)
        batch.request_counts.completed, batch.request_counts.failed = len(done_ok), len(done_err)
        self.store.save(tenant, batch)
        answered = done_ok | done_err
        pending = [line for line in await asyncio.to_thread(run_order, lines) if line.custom_id not in answered]
        tasks: set[asyncio.Task[None]] = set()
        with open(out_path, "ab") as out, open(err_path, "ab") as err:

            async def answer(line: BatchLine) -> None:
                if self.metrics:
                    self.metrics.in_flight.inc()
                try:
                    while True:
                        try:
                            status, body = await self.caller.post(line.url, msgspec.json.encode(line.body), tenant)
                        except Exception as e:  # the app answers errors itself; this is a bug, kept with its line
                            log.exception("batch %s line %s failed", batch.id, line.custom_id)
                            status, body = (
                                500,
                                msgspec.json.encode(
                                    {
                                        "error": {
                                            "message": f"The server failed on this line: {type(e).__name__}",
                                            "type": "server_error",
                                            "param": None,
                                            "code": "internal_error",
                                        }
                                    }
                                ),
                            )
                        if status != 503:
                            break
                        await asyncio.sleep(OVERLOADED_RETRY_S)  # queue full or engine stopping: run it again
                    ok = 200 <= status < 300
                    f = out if ok else err
                    f.write(result_line(line, status, body))  # one whole line, then flushed: no await between
                    f.flush()
                    if ok:
                        batch.request_counts.completed += 1
                    else:
                        batch.request_counts.failed += 1
                    if self.metrics:
                        self.metrics.answered(ok)
                    self.store.save(tenant, batch)
                finally:
                    if self.metrics:
                        self.metrics.in_flight.dec()

            queue = iter(pending)
            more = True
            try:
                while batch.status == "in_progress" and time.time() < batch.expires_at:
                    while more and len(tasks) < self.concurrency:
                        line = next(queue, None)
                        if line is None:
                            more = False
                            break
                        task = asyncio.create_task(answer(line))
                        tasks.add(task)
                        task.add_done_callback(tasks.discard)
                    if not tasks:
                        break
                    # short waits: a cancel (a status change) is seen within CANCEL_POLL_S
                    await asyncio.wait(set(tasks), timeout=CANCEL_POLL_S, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in list(tasks):  # cancelled, expired or shutting down: abort what is in flight
                    task.cancel()
                if tasks:
                    await asyncio.gather(*tasks, return_exceptions=True)
                out.flush()
                err.flush()
                os.fsync(out.fileno())
                os.fsync(err.fileno())

    def _finish_files(self, tenant: str, batch: BatchObject) -> None:
        """Give the output and error files their records (an error file only when a line failed)."""
        if batch.output_file_id is None:
            return
        self.files.finish(tenant, batch.output_file_id, f"{batch.id}_output.jsonl", "batch_output")
        if batch.error_file_id is not None:
            if batch.request_counts.failed:
                self.files.finish(tenant, batch.error_file_id, f"{batch.id}_error.jsonl", "batch_output")
            else:
                self.files.content_path(tenant, batch.error_file_id).unlink(missing_ok=True)
                batch.error_file_id = None
