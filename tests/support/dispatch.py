"""A dispatch record's envelope, as the relay publishes one."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from schemas.envelopes import DispatchEnvelope
from schemas.jobs import JobKind, Priority


def envelope(
    job_id: str,
    prompt_tokens: int = 100,
    max_tokens: int = 60,
    kind: JobKind = JobKind.SUMMARIZE,
) -> DispatchEnvelope:
    """A summarize job's by default; one longer than its engine's context is cut into a
    graph, never decoded whole (``kind=COMPLETE`` for one that is)."""
    return DispatchEnvelope(
        job_id=job_id,
        tenant="t",
        kind=kind,
        priority=Priority.NORMAL,
        max_tokens=max_tokens,
        prompt_tokens=prompt_tokens,
        deadline=datetime.now(UTC) + timedelta(minutes=5),
    )
