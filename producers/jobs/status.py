"""What a status answer carries beyond the row: an ETag, a queue estimate, a poll hint."""

from __future__ import annotations

import hashlib
import math
from datetime import UTC, datetime, timedelta

from producers.jobs.repository import JobRepository
from producers.lag.rule import LagSnapshot
from schemas.api import JobView
from schemas.jobs import Job, JobKind
from schemas.states import JobState

# Poll hints stay within these bounds whatever the estimate says.
MIN_POLL_S = 1
MAX_POLL_S = 30
# A running job: about how often it is worth looking again.
RUNNING_POLL_S = 2


def etag(job: Job, view: JobView | None = None) -> str:
    """Weak: the view also carries last_seen_at (renewed by polls) and estimates, which do
    not make a new version. Changes with every state change, attempt and write, and with a
    graph's progress (``view``'s)."""
    parts: tuple[str, ...] = (job.id, job.state.value, str(job.attempt), job.updated_at.isoformat())
    if view is not None and view.graph is not None:
        parts = (*parts, str(view.graph.level), str(view.graph.ended))
    return 'W/"' + hashlib.sha256("|".join(parts).encode()).hexdigest()[:32] + '"'


def matches(if_none_match: str | None, tag: str) -> bool:
    """RFC 9110 If-None-Match, weak comparison."""
    if not if_none_match:
        return False
    if if_none_match.strip() == "*":
        return True
    wanted = tag.removeprefix("W/")
    return any(t.strip().removeprefix("W/") == wanted for t in if_none_match.split(","))


async def view(
    repo: JobRepository, lag: LagSnapshot, job: Job, status_url: str, *, now: datetime | None = None
) -> JobView:
    """The job's view; for a job not started yet, how many are ahead of it and when it may
    start at the measured drain rate (None while the rate is unknown)."""
    if job.state not in (JobState.QUEUED, JobState.DISPATCHED):
        graph = await repo.graph(job.id) if job.kind is JobKind.SUMMARIZE else None
        return JobView.of(job, status_url, graph=graph)
    position = await repo.queue_position(job)
    wait_s = lag.drain_time_s(position + 1)
    start = None
    if wait_s is not None:
        start = (now or datetime.now(UTC)) + timedelta(seconds=wait_s)
    return JobView.of(job, status_url, queue_position=position, expected_start_at=start)


def retry_after_s(job: JobView, *, now: datetime | None = None) -> int | None:
    """Seconds until a poll may see a change: None once the job is terminal."""
    if job.state.terminal:
        return None
    if job.expected_start_at is not None:
        ahead = (job.expected_start_at - (now or datetime.now(UTC))).total_seconds()
        return min(MAX_POLL_S, max(MIN_POLL_S, math.ceil(ahead / 2)))
    return RUNNING_POLL_S
