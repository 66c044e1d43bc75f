"""A batch's OpenAI Batch output lines, streamed in submission order: every line (GET
/v1/batches/{id}/results), or one part of them, written as OpenAI's output and error files
while the batch is finalizing (``producers.batches.lifecycle_repository``)."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator

from producers.batches.repository import BatchStore
from schemas.batches.output import ResultPart, in_part, result_line

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
