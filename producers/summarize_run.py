"""`sluicegate summarize`, the loop: submit the batch (or find it again), then follow it
with a progress bar, appending each result to the output file as soon as its turn comes.

Results are read in submission order with a cursor (the last line's job), so the file is
in input order and a rerun goes on where the file ends. Each appended chunk is flushed
and fsynced before the cursor moves.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from producers.client import SluicegateClient
from producers.summarize import InputError, Resume, build_requests, digest, written
from schemas.batches import BatchView, window_seconds

DONE = frozenset({"completed", "expired", "cancelled"})
STATE_ORDER = ("succeeded", "running", "dispatched", "queued", "failed", "expired")


def counts_text(counts: Mapping[str, int]) -> str:
    """``succeeded 120 · running 8 · queued 872``: the batch's jobs by state."""
    known = [s for s in STATE_ORDER if counts.get(s)]
    rest = sorted(s for s in counts if s not in STATE_ORDER and counts[s])
    return " · ".join(f"{state} {counts[state]}" for state in [*known, *rest]) or "submitted"


async def _batch(
    client: SluicegateClient, requests: list[dict[str, Any]], window: str, out: Path
) -> BatchView:
    """The run's batch: the one recorded beside ``out``, else a new one (the same input
    always maps to the same Idempotency-Key, so this never makes a second batch)."""
    fingerprint = digest(requests, window)
    resume = Resume.load(out)
    if resume is not None:
        if resume.digest != fingerprint:
            raise InputError(
                f"{out} holds the results of another input or deadline; choose another --out "
                f"or remove {out} and {Resume.path(out)}"
            )
        return await client.get_batch(resume.batch_id)
    batch = await client.create_batch(
        requests, completion_window=window, idempotency_key=f"summarize-{fingerprint}"
    )
    Resume(batch_id=batch.id, digest=fingerprint).save(out)
    return batch


async def summarize(
    client: SluicegateClient,
    source: Path,
    *,
    window: str,
    out: Path,
    max_tokens: int,
    console: Console,
    poll_s: float = 1.0,
) -> int:
    """Run (or resume) the batch to its end; 0 when every request succeeded, else 1."""
    window_seconds(window)  # a bad --deadline fails here, before anything is read
    requests = build_requests(source, max_tokens=max_tokens)
    batch = await _batch(client, requests, window, out)
    done = written(out)
    have = set(done.custom_ids)
    after = done.last_job_id
    total = batch.request_counts.total
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console) as progress, out.open("a") as file:
        task = progress.add_task(counts_text(batch.counts), total=total, completed=len(have))
        while True:
            lines = await client.batch_results(batch.id, after=after)
            fresh = [line for line in lines if line["custom_id"] not in have]
            if fresh:
                file.writelines(_json_line(line) for line in fresh)
                file.flush()
                os.fsync(file.fileno())
                have.update(line["custom_id"] for line in fresh)
            if lines:
                after = lines[-1]["sluicegate"]["job_id"]
            batch = await client.get_batch(batch.id)
            progress.update(task, completed=len(have), description=counts_text(batch.counts))
            if batch.status in DONE and len(have) >= total:
                break
            await asyncio.sleep(poll_s)
    counts = batch.request_counts
    console.print(
        f"batch {batch.id} {batch.status}: {counts.completed} succeeded, {counts.failed} not "
        f"({counts_text(batch.counts)}); results in {out}"
    )
    return 0 if counts.completed == total else 1


def _json_line(line: Mapping[str, Any]) -> str:
    return json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n"
