"""The meter's rule and its rounds, with a fake store: what it asks the store to release,
when it looks for expired jobs, and what it tells admission."""

from __future__ import annotations

from datetime import UTC, datetime

from producers.batches.meter import Meter, room
from producers.batches.meter_repository import Backlog, Budget, MeterRound
from producers.lag.estimate import LagEstimate


class FakeStore:
    def __init__(self, backlog: Backlog, held: int = 1000) -> None:
        self.backlog = backlog
        self.held = held
        self.asked: list[tuple[int, bool]] = []

    async def round(self, budget: Budget, now: datetime, *, expire: bool = True) -> MeterRound:
        wanted = budget(self.backlog)
        self.asked.append((wanted, expire))
        released = min(wanted, self.held)
        self.held -= released
        return MeterRound(wanted=wanted, released=released, expired=0, backlog=self.backlog)


class FakeAdmission:
    """The controller as the meter sees it: the lag admission sees, and the estimate the
    meter reports into."""

    def __init__(self, lag: int | None) -> None:
        self.lag = lag
        self.estimate = LagEstimate()

    def current_lag(self) -> int | None:
        return self.lag


def meter(store: FakeStore, lag: int | None) -> tuple[Meter, LagEstimate]:
    admission = FakeAdmission(lag)
    made = Meter(
        store,  # type: ignore[arg-type]
        admission,  # type: ignore[arg-type]
        soft=100,
        fill=0.5,
        interval_s=0.5,
    )
    return made, admission.estimate


def test_the_room_is_the_smaller_of_soft_and_the_batches_fill() -> None:
    assert room(Backlog(jobs=0, batch_jobs=0), lag=0, soft=100, fill=50) == 50
    assert room(Backlog(jobs=70, batch_jobs=10), lag=0, soft=100, fill=50) == 30
    assert room(Backlog(jobs=20, batch_jobs=20), lag=0, soft=100, fill=50) == 30
    assert room(Backlog(jobs=20, batch_jobs=20), lag=95, soft=100, fill=50) == 5
    assert room(Backlog(jobs=120, batch_jobs=60), lag=0, soft=100, fill=50) == 0


async def test_a_round_releases_the_room_and_tells_admission() -> None:
    store = FakeStore(Backlog(jobs=30, batch_jobs=10))
    m, estimate = meter(store, 0)
    done = await m.step(datetime.now(UTC))
    assert done.released == 40  # fill 50 less the 10 batch jobs in the backlog
    assert estimate.tally() == 40  # released jobs are committed ones
    # and the backlog it counted (30, before the round) replaced the reading's lag (0)
    assert estimate.lag(0, reading_age_s=1.0) == 30 + 40


async def test_nothing_is_released_while_the_lag_is_unknown() -> None:
    store = FakeStore(Backlog(jobs=0, batch_jobs=0))
    m, estimate = meter(store, None)
    await m.step()
    assert store.asked == [(0, True)]  # expiry still runs
    assert estimate.tally() == 0


async def test_expired_jobs_are_looked_for_once_a_second_not_every_round() -> None:
    store = FakeStore(Backlog(jobs=0, batch_jobs=0))
    m, _ = meter(store, 0)
    await m.step()
    await m.step()
    assert [expire for _, expire in store.asked] == [True, False]


async def test_a_job_ending_wakes_the_meter_only_while_held_jobs_wait_for_room() -> None:
    store = FakeStore(Backlog(jobs=0, batch_jobs=0), held=30)
    m, _ = meter(store, 0)
    m.job_ended()
    assert m._wake.is_set()  # nothing known yet: held jobs may wait
    m._wake.clear()
    await m.step()  # room for 50, only 30 held: all released
    m.job_ended()
    assert not m._wake.is_set()
    m.wake()  # a new batch
    assert m._wake.is_set()
    m._wake.clear()
    store.held = 80
    await m.step()  # room for 50 of 80: the rest waits for room
    m.job_ended()
    assert m._wake.is_set()
