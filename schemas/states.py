"""The job state machine of DESIGN.md as an explicit transition table."""

from __future__ import annotations

from enum import StrEnum


class JobState(StrEnum):
    QUEUED = "queued"
    DISPATCHED = "dispatched"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    EXPIRED = "expired"
    CANCELLED = "cancelled"
    ABANDONED = "abandoned"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATES


TERMINAL_STATES: frozenset[JobState] = frozenset(
    {
        JobState.SUCCEEDED,
        JobState.FAILED,
        JobState.EXPIRED,
        JobState.CANCELLED,
        JobState.ABANDONED,
    }
)

_DROPS = frozenset({JobState.EXPIRED, JobState.CANCELLED, JobState.ABANDONED})

TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.QUEUED: frozenset({JobState.DISPATCHED}) | _DROPS,
    JobState.DISPATCHED: frozenset({JobState.RUNNING}) | _DROPS,
    # running -> running is a redelivery taking over an attempt whose worker is gone;
    # the attempt counter fences the old worker's terminal write.
    JobState.RUNNING: frozenset({JobState.RUNNING, JobState.SUCCEEDED, JobState.FAILED}) | _DROPS,
    **{state: frozenset() for state in TERMINAL_STATES},
}


def can_transition(source: JobState, target: JobState) -> bool:
    return target in TRANSITIONS[source]


def sources_of(target: JobState) -> frozenset[JobState]:
    """Every state from which ``target`` may be entered directly."""
    return frozenset(s for s, targets in TRANSITIONS.items() if target in targets)


# A worker that reads a dispatch record may start the job from any state that can reach
# ``running`` through ``dispatched``: the record itself proves the dispatch, even when the
# relay has not yet recorded it.
CLAIMABLE_STATES: frozenset[JobState] = sources_of(JobState.RUNNING) | sources_of(
    JobState.DISPATCHED
)
CANCELLABLE_STATES: frozenset[JobState] = sources_of(JobState.CANCELLED)
