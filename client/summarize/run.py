"""`sluicegate summarize`, the loop: read the input, submit the batch (or find it again), then
follow it, appending each result to the output file as soon as its turn comes.

Results are read in submission order with a cursor (the last line's job), so the file is
in input order and a rerun goes on where the file ends. Each appended chunk is flushed
and fsynced before the cursor moves.

Exit codes: 0 every document succeeded; 1 some ended otherwise (their lines hold the error);
3 the batch ran but some files were skipped (listed in ``<out>.skipped.jsonl``).
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console

from client.api import ApiError, AsyncClient
from client.summarize.documents import DOCUMENT_SUFFIXES
from client.summarize.report import Report, counts_text, cut_at_length, cut_text, span, when
from client.summarize.requests import (
    Input,
    InputError,
    Resume,
    build_requests,
    digest,
    of_documents,
    passed_over_text,
    skipped_path,
    write_skipped,
    written,
)
from plumbing.documents.extract import KINDS_TEXT
from plumbing.documents.limits import DocumentLimits
from schemas.batches import BatchView, InvalidCompletionWindow, window_seconds
from schemas.sampling import SummaryOptions

DONE = frozenset({"completed", "expired", "cancelled"})
ENDED = DONE | {"failed"}  # a batch that takes no more work
OK, NOT_ALL_SUCCEEDED, PARTIAL = 0, 1, 3


@dataclass(frozen=True)
class Options:
    window: str
    out: Path
    max_tokens: int
    max_bytes: int
    encoding: str | None = None
    strict: bool = False
    new: bool = False
    limits: DocumentLimits | None = None  # the files' (settings.documents.limits())
    summary: SummaryOptions | None = None  # each document's (--style, --words, ...)


def refusal_line(refusal: ApiError, wait_s: float) -> str:
    """``refused (tenant_rpm): tenant acme is over its RPM limit; retrying in 48 s, at …``"""
    at = datetime.now(UTC).timestamp() + wait_s
    clock = datetime.fromtimestamp(at).strftime("%H:%M:%S")
    return f"refused ({refusal.code}): {refusal.message}; retrying in {span(wait_s)}, at {clock}"


def read_input(source: Path, options: Options, console: Console) -> Input:
    """The batch's requests; each skipped file is said at once, and listed beside ``out``."""
    found = build_requests(
        source,
        max_tokens=options.max_tokens,
        max_bytes=options.max_bytes,
        encoding=options.encoding,
        limits=options.limits,
        summary=options.summary,
    )
    if source.is_dir() or found.skipped or source.suffix.lower() in DOCUMENT_SUFFIXES:
        files = len(found.requests) + len(found.skipped)
        console.print(
            f"read {files:,} files from {source}: {len(found.requests):,} to summarize"
            + (f", {len(found.skipped):,} skipped" if found.skipped else ""),
            highlight=False,
        )
    else:
        console.print(f"read {len(found.requests):,} requests from {source}", highlight=False)
    for skip in found.skipped:
        console.print(f"  skipped {skip.name}: {skip.message}", highlight=False, markup=False)
    if found.passed_over:
        console.print(
            f"  passed over {passed_over_text(found.passed_over)}: only {KINDS_TEXT} are read",
            highlight=False,
            markup=False,
        )
    if found.skipped and options.strict:
        raise InputError(
            f"{len(found.skipped)} of {len(found.requests) + len(found.skipped)} files cannot be "
            "summarized (listed above); nothing was submitted (--strict)"
        )
    if not found.requests:
        raise InputError(f"none of the files under {source} can be summarized (listed above)")
    if (listed := write_skipped(options.out, found.not_summarized())) is not None:
        console.print(f"  the skipped files are listed in {listed}", highlight=False)
    return found


async def _batch(
    client: AsyncClient, found: Input, options: Options, console: Console, have: int
) -> BatchView:
    """The run's batch, said in its first line: the one recorded beside ``out`` (resumed),
    an earlier one with the same input (the Idempotency-Key finds it), or a new one."""
    out, requests = options.out, found.requests
    fingerprint = digest(requests, options.window)
    if (batch := await _resumed(client, out, fingerprint, options.new, have)) is not None:
        counts = batch.request_counts
        console.print(
            f"resuming batch {batch.id} (submitted {_age(batch)} ago, deadline "
            f"{when(batch.deadline)}): {counts.completed + counts.failed:,} of {counts.total:,} "
            f"already done, {have:,} written to {out} (in input order)",
            highlight=False,
        )
        return batch
    if options.new and have:
        raise InputError(f"{out} holds results of an earlier batch: give --new another --out")
    key = f"summarize-{fingerprint}" + (f"-{uuid.uuid4().hex}" if options.new else "")
    created = await client.create_batch(
        requests, completion_window=options.window, idempotency_key=key
    )
    batch = created.batch
    Resume(
        batch_id=batch.id,
        digest=fingerprint,
        created_at=datetime.fromtimestamp(batch.created_at, UTC).isoformat(),
        deadline=batch.deadline.isoformat(),
        new=options.new,
    ).save(out)
    if created.replayed:
        console.print(
            f"reusing batch {batch.id}, submitted {_age(batch)} ago with the same documents "
            f"and --deadline ({batch.status}, deadline {when(batch.deadline)}); "
            "--new submits a new batch",
            highlight=False,
        )
    else:
        console.print(
            f"submitted batch {batch.id}: {len(requests):,} requests, deadline "
            f"{when(batch.deadline)}",
            highlight=False,
        )
    return batch


async def _resumed(
    client: AsyncClient, out: Path, fingerprint: str, new: bool, have: int
) -> BatchView | None:
    """The batch recorded beside ``out`` when this run goes on with it: always without
    ``--new``; with it, when a ``--new`` run made it and it has not ended or ``out`` does
    not hold all its results yet (an interrupted ``--new`` run is resumed by the same
    command)."""
    resume = Resume.load(out)
    if resume is None or (new and not resume.new):
        return None
    if resume.digest != fingerprint:
        if new:
            return None
        raise InputError(
            f"{out} holds the results of another input, --deadline or summary asked for "
            "(--style, --instructions, --language, --words); choose another --out "
            f"or remove {out} and {Resume.path(out)}"
        )
    batch = await client.get_batch(resume.batch_id)
    if new and batch.status in ENDED and have >= batch.request_counts.total:
        return None  # that run is over: --new makes another
    return batch


def _age(batch: BatchView) -> str:
    return span(datetime.now(UTC).timestamp() - batch.created_at)


async def summarize(
    client: AsyncClient,
    source: Path,
    options: Options,
    console: Console,
    *,
    poll_s: float = 1.0,
) -> int:
    """Run (or resume) the batch to its end; the exit code (module docstring)."""
    try:
        window_seconds(options.window)  # a bad --deadline fails here, before anything is read
    except InvalidCompletionWindow:
        raise InputError(
            f"--deadline {options.window!r} is not a duration such as 30m, 2h or 1h30m"
        ) from None
    _make_folder(options.out)
    found = read_input(source, options, console)
    done = written(options.out)
    batch = await _batch(client, found, options, console, len(done.custom_ids))
    batch = await _follow(
        client, batch, options.out, done.custom_ids, done.last_job_id, console, poll_s
    )
    counts = batch.request_counts
    others = {s: n for s, n in batch.counts.items() if s != "succeeded"}
    console.print(
        f"batch {batch.id} {batch.status}: {counts.completed:,} of {counts.total:,} succeeded"
        + (f", {counts_text(others)}" if others else "")
        + f"; results in {options.out}",
        highlight=False,
    )
    if cut := cut_at_length(options.out):
        # Honest about length: a summary the engine cut at max_tokens is not a whole one.
        per_document = options.max_tokens if of_documents(source) else None
        console.print(cut_text(cut, per_document), highlight=False, markup=False)
    if found.skipped:
        console.print(
            f"{len(found.skipped):,} files skipped, listed in {skipped_path(options.out)}",
            highlight=False,
        )
    if found.passed_over:
        console.print(
            f"passed over {passed_over_text(found.passed_over)} (not of a kind that is read), "
            f"listed in {skipped_path(options.out)}",
            highlight=False,
            markup=False,
        )
    if counts.completed < counts.total:
        return NOT_ALL_SUCCEEDED
    return PARTIAL if found.skipped else OK


def _make_folder(out: Path) -> None:
    """The folder of ``--out`` (and of the lists beside it), made when missing."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(
            f"--out {out}: cannot make its folder {out.parent}: {exc.strerror or exc}"
        ) from None


async def _follow(
    client: AsyncClient,
    batch: BatchView,
    out: Path,
    custom_ids: frozenset[str],
    after: str | None,
    console: Console,
    poll_s: float,
) -> BatchView:
    have = set(custom_ids)
    total = batch.request_counts.total
    with Report(console, total) as report, out.open("a", encoding="utf-8") as file:
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
            report.update(batch)
            if batch.status == "failed" or (batch.status in DONE and len(have) >= total):
                return batch
            await asyncio.sleep(poll_s)


def _json_line(line: Mapping[str, Any]) -> str:
    return json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n"
