"""Submit documents for summarization and follow them to the end, with live progress."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.live import Live
from rich.table import Table

from client.api import RetryPolicy, SluicegateClient
from client.summarize.documents import Skipped, read_path
from schemas.api import JobView
from schemas.jobs import JobKind

POLL_S = 0.2


@dataclass
class Tracked:
    name: str
    job_id: str
    submitted: float
    view: JobView | None = None
    finished: float | None = None


def read_documents(
    paths: list[Path], *, max_bytes: int
) -> tuple[list[tuple[str, str]], list[Skipped]]:
    """(name, text) for each file, or each *.txt/*.md file under a folder; and the files
    that cannot be documents, with why (``client.summarize.documents``)."""
    found: list[tuple[str, str]] = []
    skipped: list[Skipped] = []
    for path in paths:
        folder = read_path(path, str(path), max_bytes=max_bytes)
        found.extend((d.name, d.text) for d in folder.documents)
        skipped.extend(folder.skipped)
    return found, skipped


async def submit_all(
    client: SluicegateClient, documents: list[tuple[str, str]], *, max_tokens: int, ttl_s: float
) -> list[Tracked]:
    tracked = []
    for name, text in documents:
        answer = await client.submit(JobKind.SUMMARIZE, text, max_tokens=max_tokens, ttl_s=ttl_s)
        tracked.append(Tracked(name=name, job_id=answer.id, submitted=time.monotonic()))
    return tracked


def _progress(jobs: list[Tracked]) -> Table:
    counts = Counter(j.view.state.value if j.view else "queued" for j in jobs)
    done = sum(1 for j in jobs if j.finished is not None)
    table = Table(title=f"{done}/{len(jobs)} jobs terminal", show_header=True)
    for state in sorted(counts):
        table.add_column(state)
    table.add_row(*(str(counts[s]) for s in sorted(counts)))
    return table


async def follow(client: SluicegateClient, jobs: list[Tracked], console: Console) -> None:
    with Live(_progress(jobs), console=console, transient=True) as live:
        while any(j.finished is None for j in jobs):
            for job in jobs:
                if job.finished is None:
                    job.view = await client.get(job.job_id)
                    if job.view.state.terminal:
                        job.finished = time.monotonic()
            live.update(_progress(jobs))
            await asyncio.sleep(POLL_S)


def results_table(jobs: list[Tracked]) -> Table:
    table = Table(title="Summaries", show_lines=True)
    table.add_column("document")
    table.add_column("state")
    table.add_column("end-to-end", justify="right")
    table.add_column("summary")
    for job in jobs:
        view = job.view
        text = ""
        if view is not None and view.result is not None:
            text = str(view.result.get("text", "")).strip()
            if view.result.get("simulated"):
                text = f"[dim](simulator engine)[/dim] {text}"
        elif view is not None and view.error is not None:
            text = str(view.error.get("message", ""))
        elapsed = ""
        if view is not None and view.finished_at is not None:
            elapsed = f"{(view.finished_at - view.created_at).total_seconds():.2f}s"
        table.add_row(job.name, view.state.value if view else "?", elapsed, text)
    return table


async def run_demo(
    api_url: str,
    documents: list[tuple[str, str]],
    *,
    console: Console,
    api_key: str | None = None,
    max_tokens: int = 120,
    ttl_s: float = 600.0,
) -> list[Tracked]:
    async with SluicegateClient(api_url, api_key=api_key, retry=RetryPolicy()) as client:
        jobs = await submit_all(client, documents, max_tokens=max_tokens, ttl_s=ttl_s)
        console.print(f"submitted {len(jobs)} documents to {api_url}")
        await follow(client, jobs, console)
    console.print(results_table(jobs))
    return jobs
