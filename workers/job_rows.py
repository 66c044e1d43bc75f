"""What the worker's repository makes of a job's row: the pre-decode gate's candidate, the
reason a stopped job gives, and the outbox row of a job event."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from schemas.envelopes import JobEvent
from schemas.jobs import JobKind
from schemas.states import JobState
from workers.gate import Candidate


def reason_of(error: Mapping[Any, Any] | None, state: str) -> str:
    if not error:
        return state
    return str(error.get("reason") or error.get("code") or state)


def candidate_of(row: Mapping[Any, Any], prompt_tokens: int) -> Candidate:
    return Candidate(
        job_id=str(row["id"]),
        state=JobState(row["state"]),
        kind=JobKind(row["kind"]),
        prompt_tokens=prompt_tokens,
        max_tokens=row["max_tokens"],
        deadline=row["deadline"],
        abandon_after_s=row["abandon_after_s"],
        last_seen_at=row["last_seen_at"],
        db_now=row["db_now"],
        reason=reason_of(row["error"], row["state"]),
    )


def event_row(
    topic: str,
    row: Mapping[Any, Any],
    state: JobState,
    attempt: int,
    at: datetime,
    error: Mapping[str, Any],
) -> dict[str, object]:
    """An outbox row announcing the job's (``row``: id, tenant, callback_url) new state."""
    event = JobEvent(
        job_id=str(row["id"]),
        tenant=row["tenant"],
        state=state,
        attempt=attempt,
        at=at,
        callback_url=row["callback_url"],
        error_code=error.get("code"),
        in_batch=row["batch_id"] is not None,
    )
    return event.outbox_row(topic, event.job_id)
