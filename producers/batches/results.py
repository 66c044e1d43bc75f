"""A batch's OpenAI Batch output lines, streamed in submission order: every line (GET
/v1/batches/{id}/results), or one part of them as OpenAI's output and error files (GET
/v1/files/{id} and its content)."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from dataclasses import dataclass

from producers.batches.repository import BatchStore
from schemas.batches import BatchView, ResultPart, in_part, result_line
from schemas.batches import result_file as result_file_name
from schemas.errors import BatchNotFound
from schemas.files import FileNotFound, FileObject

RESULTS_CHUNK = 500


async def result_lines(
    store: BatchStore,
    batch_id: str,
    endpoint: str,
    *,
    after: str | None = None,
    part: ResultPart | None = None,
) -> AsyncGenerator[bytes, None]:
    """The lines of the batch's ended jobs after job ``after``, up to the first that has
    not ended, a chunk of jobs at a time; ``part``: only the output or only the errors."""
    cursor = after
    while True:
        run = await store.finished_run(batch_id, after=cursor, limit=RESULTS_CHUNK)
        chunk = "".join(
            json.dumps(result_line(endpoint, job), separators=(",", ":")) + "\n"
            for job in run
            if in_part(job, part)
        )
        if chunk:
            yield chunk.encode()
        if run:
            cursor = run[-1].id
        if len(run) < RESULTS_CHUNK:
            return


@dataclass(frozen=True, kw_only=True)
class ResultFile:
    """A batch's output or error file that the caller may read: its id, batch and part."""

    file_id: str
    batch: BatchView
    part: ResultPart

    def lines(self, store: BatchStore) -> AsyncGenerator[bytes, None]:
        return result_lines(store, self.batch.id, self.batch.endpoint, part=self.part)

    async def file_object(self, store: BatchStore) -> FileObject:
        """OpenAI's file object; its size is that of the lines, rendered once to count."""
        size = 0
        async for chunk in self.lines(store):
            size += len(chunk)
        batch = self.batch
        return FileObject(
            id=self.file_id,
            bytes=size,
            created_at=batch.completed_at or batch.expired_at or batch.cancelled_at or 0,
            filename=f"batch_{batch.id}_{self.part}.jsonl",
            purpose="batch_output",
        )


async def find_result_file(store: BatchStore, tenant: str, file_id: str) -> ResultFile | None:
    """The result file ``file_id`` names; None when it names no result file. FileNotFound
    for one that the caller's batch has not named (another tenant's, a batch still
    running, a part with no lines)."""
    named = result_file_name(file_id)
    if named is None:
        return None
    batch_id, part = named
    try:
        batch = await store.get(tenant, batch_id)
    except BatchNotFound:
        raise FileNotFound(f"no file {file_id}") from None
    if file_id not in (batch.output_file_id, batch.error_file_id):
        raise FileNotFound(f"no file {file_id}: the batch has not ended with such lines")
    return ResultFile(file_id=file_id, batch=batch, part=part)
