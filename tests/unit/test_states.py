import itertools

import pytest

from schemas.states import (
    CANCELLABLE_STATES,
    CLAIMABLE_STATES,
    TERMINAL_STATES,
    JobState,
    can_transition,
)

S = JobState
ALLOWED = {
    (S.QUEUED, S.DISPATCHED),
    (S.QUEUED, S.EXPIRED),
    (S.QUEUED, S.CANCELLED),
    (S.QUEUED, S.ABANDONED),
    (S.DISPATCHED, S.RUNNING),
    (S.DISPATCHED, S.EXPIRED),
    (S.DISPATCHED, S.CANCELLED),
    (S.DISPATCHED, S.ABANDONED),
    (S.RUNNING, S.RUNNING),
    (S.RUNNING, S.SUCCEEDED),
    (S.RUNNING, S.FAILED),
    (S.RUNNING, S.EXPIRED),
    (S.RUNNING, S.CANCELLED),
    (S.RUNNING, S.ABANDONED),
}


@pytest.mark.parametrize(("source", "target"), sorted(ALLOWED))
def test_allowed_transition(source: JobState, target: JobState) -> None:
    assert can_transition(source, target)


@pytest.mark.parametrize(
    ("source", "target"),
    sorted(set(itertools.product(JobState, JobState)) - ALLOWED),
)
def test_forbidden_transition(source: JobState, target: JobState) -> None:
    assert not can_transition(source, target)


def test_terminal_states_are_final() -> None:
    assert {s for s in JobState if s.terminal} == TERMINAL_STATES
    for state in TERMINAL_STATES:
        assert not any(can_transition(state, t) for t in JobState)


def test_claim_and_cancel_sources() -> None:
    assert {S.QUEUED, S.DISPATCHED, S.RUNNING} == CLAIMABLE_STATES
    assert {S.QUEUED, S.DISPATCHED, S.RUNNING} == CANCELLABLE_STATES
