"""Submit documents for summarization and follow them to the end, with live progress."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from client.api import AsyncClient, RetryPolicy
from client.summarize.documents import Skipped, read_path
from schemas.api import JobView
from schemas.jobs import JobKind

POLL_S = 0.2
SUMMARY_CHARS = 120
NAME_CHARS = 28  # a document's name, at most (cut with an ellipsis)
"""A summary in the table: a line or two (the full text is in the results file)."""


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
    """(name, text) for each file, or each document file under a folder; and the files
    that cannot be documents, with why (``client.summarize.documents``)."""
    found: list[tuple[str, str]] = []
    skipped: list[Skipped] = []
    for path in paths:
        folder = read_path(path, str(path), max_bytes=max_bytes)
        found.extend((d.name, d.text) for d in folder.documents)
        skipped.extend(folder.skipped)
    return found, skipped


async def submit_all(
    client: AsyncClient, documents: list[tuple[str, str]], *, max_tokens: int, ttl_s: float
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


async def follow(client: AsyncClient, jobs: list[Tracked], console: Console) -> None:
    with Live(_progress(jobs), console=console, transient=True) as live:
        while any(j.finished is None for j in jobs):
            for job in jobs:
                if job.finished is None:
                    job.view = await client.get(job.job_id)
                    if job.view.state.terminal:
                        job.finished = time.monotonic()
            live.update(_progress(jobs))
            await asyncio.sleep(POLL_S)


def short(text: str, limit: int = SUMMARY_CHARS) -> str:
    """``text`` on one line, cut to ``limit`` characters with an ellipsis."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1].rstrip() + "…"


def _summary(view: JobView | None) -> str:
    """A job's full summary (or its error's message)."""
    if view is not None and view.result is not None:
        return str(view.result.get("text", "")).strip()
    if view is not None and view.error is not None:
        return str(view.error.get("message", ""))
    return ""


def results_table(jobs: list[Tracked], width: int = 120) -> Table:
    """One line a document in a terminal ``width`` wide: the summary cut to what fits
    (the full text is in the results file ``write_results`` makes)."""
    simulated = any(j.view and j.view.result and j.view.result.get("simulated") for j in jobs)
    title = "Summaries (simulated: the simulator echoes its input)" if simulated else "Summaries"
    table = Table(title=title)
    name_width = min(NAME_CHARS, max((len(j.name) for j in jobs), default=8))
    table.add_column("document", no_wrap=True, overflow="ellipsis", max_width=name_width)
    table.add_column("state", no_wrap=True)
    table.add_column("end-to-end", justify="right", no_wrap=True)
    table.add_column("summary", no_wrap=True, overflow="ellipsis")
    # The other columns, their padding and the borders: 13 characters and the widest state.
    room = max(
        16, min(SUMMARY_CHARS, width - name_width - len("cancelled") - len("end-to-end") - 13)
    )
    for job in jobs:
        view = job.view
        elapsed = ""
        if view is not None and view.finished_at is not None:
            elapsed = f"{(view.finished_at - view.created_at).total_seconds():.2f}s"
        state = view.state.value if view else "?"
        table.add_row(job.name, state, elapsed, Text(short(_summary(view), room)))
    return table


def write_results(jobs: list[Tracked], path: Path) -> None:
    """Each document's job, state and full summary, one JSON line each."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as out:
        for job in jobs:
            view, result = job.view, (job.view.result if job.view else None) or {}
            line = {
                "document": job.name,
                "job_id": job.job_id,
                "state": view.state.value if view else None,
                "summary": _summary(view),
                "engine": result.get("engine"),
                "served_model": result.get("served_model"),
                "simulated": result.get("simulated"),
            }
            out.write(json.dumps(line, ensure_ascii=False) + "\n")


async def run_demo(
    api_url: str,
    documents: list[tuple[str, str]],
    *,
    console: Console,
    api_key: str | None = None,
    max_tokens: int = 120,
    ttl_s: float = 600.0,
    results: Path | None = None,
) -> list[Tracked]:
    """Submit, follow, and print the table; the full summaries go to ``results`` (JSONL)."""
    async with AsyncClient(api_url, api_key=api_key, retry=RetryPolicy()) as client:
        jobs = await submit_all(client, documents, max_tokens=max_tokens, ttl_s=ttl_s)
        console.print(f"submitted {len(jobs)} documents to {api_url}")
        await follow(client, jobs, console)
    console.print(results_table(jobs, console.width))
    if results is not None:
        write_results(jobs, results)
        console.print(f"full summaries in {results}", highlight=False, soft_wrap=True)
    return jobs
