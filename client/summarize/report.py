"""What `sluicegate summarize` tells its user: a line at once, the ended jobs with an ETA from
the measured rate, a plain line every few seconds when the output is not a terminal, what a
refusal waits for, and an honest last line (the summaries cut at ``--max-tokens`` named)."""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import TracebackType
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from schemas.batches import BatchView

STATE_ORDER = ("succeeded", "running", "dispatched", "queued", "failed", "expired")
NAMES_SHOWN = 10  # the documents a closing line names, at most
RATE_WINDOW_S = 30.0
ETA_AFTER_S = 3.0  # an ETA needs a few seconds of measured rate
PLAIN_EVERY_S = 5.0


def counts_text(counts: Mapping[str, int]) -> str:
    """``succeeded 120 · running 8 · queued 872``: the batch's jobs by state."""
    known = [s for s in STATE_ORDER if counts.get(s)]
    rest = sorted(s for s in counts if s not in STATE_ORDER and counts[s])
    return " · ".join(f"{state} {counts[state]:,}" for state in [*known, *rest]) or "submitted"


def finish_reason(line: Mapping[str, Any]) -> str | None:
    """Why a result line's output ended, as its engine reported it: ``stop``, ``length``
    (cut at ``max_tokens``); None for a line without a response (it failed)."""
    body = (line.get("response") or {}).get("body") or {}
    if "finish_reason" in body:  # /v1/summarize and /v1/jobs lines
        return str(body["finish_reason"])
    choices = body.get("choices") or [{}]  # /v1/chat/completions and /v1/completions
    reason = choices[0].get("finish_reason")
    return str(reason) if reason is not None else None


def cut_at_length(out: Path) -> list[str]:
    """The custom_ids of the results file's lines whose output was cut at ``max_tokens``
    (every line written, by this run or an earlier one)."""
    cut = []
    with out.open(encoding="utf-8") as lines:
        for text in lines:
            if text.strip() and finish_reason(line := json.loads(text)) == "length":
                cut.append(str(line["custom_id"]))
    return cut


def cut_text(names: list[str], max_tokens: int | None) -> str:
    """``3 summaries were cut at --max-tokens (128): a.txt, b.pdf, c.md; raise --max-tokens``;
    ``max_tokens`` None: a JSONL file's lines, each with its own."""
    shown = ", ".join(names[:NAMES_SHOWN])
    if len(names) > NAMES_SHOWN:
        shown += f" and {len(names) - NAMES_SHOWN:,} more"
    many = len(names) != 1
    what = f"{len(names):,} {'summaries were' if many else 'summary was'}"
    if max_tokens is None:
        return f"{what} cut at their max_tokens: {shown}; raise it in their lines"
    return f"{what} cut at --max-tokens ({max_tokens:,}): {shown}; raise --max-tokens"


def ended(batch: BatchView) -> int:
    counts = batch.request_counts
    return counts.completed + counts.failed


def when(at: datetime, now: datetime | None = None) -> str:
    """``15:02:31 (in 12 min)``: a moment in local time, and how far it is."""
    now = now or datetime.now(UTC)
    local = at.astimezone()
    today = local.date() == now.astimezone().date()
    shown = local.strftime("%H:%M:%S" if today else "%Y-%m-%d %H:%M")
    seconds = (at - now).total_seconds()
    return f"{shown} ({'in ' + span(seconds) if seconds >= 0 else span(-seconds) + ' ago'})"


def span(seconds: float) -> str:
    """``45 s``, ``12 min``, ``3 h 5 min``, ``2 days``."""
    seconds = max(0, round(seconds))
    if seconds < 90:
        return f"{seconds} s"
    if seconds < 5400:
        return f"{round(seconds / 60)} min"
    if seconds < 2 * 86400:
        hours, minutes = divmod(round(seconds / 60), 60)
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    return f"{round(seconds / 86400)} days"


class Rate:
    """Ended jobs per second over the last ``RATE_WINDOW_S``."""

    def __init__(self) -> None:
        self._samples: deque[tuple[float, int]] = deque()

    def add(self, done: int, at: float | None = None) -> None:
        at = time.monotonic() if at is None else at
        self._samples.append((at, done))
        while len(self._samples) > 2 and at - self._samples[0][0] > RATE_WINDOW_S:
            self._samples.popleft()

    def per_s(self) -> float | None:
        if len(self._samples) < 2:
            return None
        (t0, d0), (t1, d1) = self._samples[0], self._samples[-1]
        if t1 - t0 < ETA_AFTER_S or d1 <= d0:
            return None
        return (d1 - d0) / (t1 - t0)


class Report:
    """The progress of one batch: a live bar on a terminal, plain lines elsewhere."""

    def __init__(self, console: Console, total: int) -> None:
        self._console = console
        self._total = total
        self._rate = Rate()
        self._plain_at = 0.0
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        if console.is_terminal:
            self._progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("{task.fields[eta]}"),
                console=console,
            )

    def __enter__(self) -> Report:
        if self._progress is not None:
            self._progress.start()
            self._task = self._progress.add_task("", total=self._total, eta="")
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._progress is not None:
            self._progress.stop()

    def line(self, text: str) -> None:
        self._console.print(text, highlight=False)

    def update(self, batch: BatchView) -> None:
        done = ended(batch)
        self._rate.add(done)
        eta = self._eta(done)
        if self._progress is not None and self._task is not None:
            self._progress.update(
                self._task, completed=done, description=counts_text(batch.counts), eta=eta
            )
            return
        now = time.monotonic()
        if now - self._plain_at >= PLAIN_EVERY_S:
            self._plain_at = now
            stamp = datetime.now().strftime("%H:%M:%S")
            self.line(f"{stamp} ended {done:,}/{self._total:,} ({counts_text(batch.counts)}){eta}")

    def _eta(self, done: int) -> str:
        rate = self._rate.per_s()
        if done >= self._total:
            return ""
        if rate is None:
            return " · ETA: measuring"
        finish = datetime.now(UTC) + timedelta(seconds=(self._total - done) / rate)
        return f" · {rate:,.1f}/s · ETA {when(finish)}"
