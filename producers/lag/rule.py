"""The lag rule, pure: from successive readings of the dispatch topic, the lag, the drain rate
μ and the arrival rate λ (smoothed), how long a backlog has stalled, and when a reading is
too old to be known.

Consumer lag = Σ over partitions (end offset - committed offset of the worker group). With an
``open`` count (``lag_measure = "open"``) a partition's lag is instead the records past the
committed offset whose job has not ended, never above its consumer lag. Accepted jobs not yet
published are added (they are backlog too). What left the lag between two readings is what
arrived less the lag's growth.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace


@dataclass(frozen=True, kw_only=True)
class LagSnapshot:
    known: bool
    lag: int
    per_partition: Mapping[int, int]
    drain_rate: float | None  # μ, records/s; None until measured
    arrival_rate: float | None  # λ, records/s
    age_s: float
    # Why the last reading failed: "database_unavailable" or "broker_unavailable".
    cause: str | None = None
    # Seconds for which there was a backlog and nothing left it (0 while it moves or is
    # empty): a long stall with no job running means no worker consumes.
    stalled_s: float = 0.0

    def drain_time_s(self, records: int) -> float | None:
        """Seconds to drain ``records`` at μ; None when μ is unknown or zero."""
        if records <= 0:
            return 0.0
        if not self.drain_rate:
            return None
        return records / self.drain_rate


UNKNOWN = LagSnapshot(
    known=False, lag=0, per_partition={}, drain_rate=None, arrival_rate=None, age_s=float("inf")
)


@dataclass(frozen=True)
class Reading:
    ends: Mapping[int, int]  # end offset per partition
    committed: Mapping[int, int]  # the group's committed offset per partition
    unpublished: int = 0  # accepted jobs not yet published
    # Per partition, the records past the committed offset whose job has not ended; None:
    # not read, the lag is the consumer lag.
    open: Mapping[int, int] | None = None
    # How long ago the reading began, as its source hands it over: 0 for one just taken,
    # more for one another API replica took (producers/lag/shared.py).
    age_s: float = 0.0
    # This process's admission tally (``LagEstimate.tally``) as the reading's PostgreSQL
    # snapshot began: the jobs it had committed by then are in the reading. None for a
    # reading another replica took.
    tally: int | None = None


@dataclass(frozen=True, kw_only=True)
class LagState:
    """What the rule keeps from one reading to the next; ``read_at`` None: no reading yet."""

    read_at: float | None = None
    ends: Mapping[int, int] = field(default_factory=dict)
    per_partition: Mapping[int, int] = field(default_factory=dict)
    consumer_lag: int = 0  # Σ end - committed, whatever the measure
    total: int = 0  # the lag: Σ per partition + unpublished
    drain_rate: float | None = None
    arrival_rate: float | None = None
    moved_at: float | None = None  # the last reading with no backlog, or a drain


def consumer_lag(ends: Mapping[int, int], committed: Mapping[int, int]) -> dict[int, int]:
    """Per partition, the records past the group's committed offset (never below 0)."""
    return {p: max(end - committed.get(p, 0), 0) for p, end in ends.items()}


def smooth(previous: float | None, sample: float, alpha: float) -> float:
    """Exponential smoothing; the first sample is taken as it is."""
    return sample if previous is None else previous + alpha * (sample - previous)


def advance(state: LagState, reading: Reading, *, now: float, smoothing: float) -> LagState:
    """The state after ``reading``, taken at ``now``."""
    consumer = consumer_lag(reading.ends, reading.committed)
    open = reading.open
    per_partition = (
        consumer
        if open is None
        else {p: min(records, open.get(p, 0)) for p, records in consumer.items()}
    )
    mu, lam, moved_at = state.drain_rate, state.arrival_rate, state.moved_at
    if state.read_at is not None and now > state.read_at:
        dt = now - state.read_at
        arrived = sum(reading.ends.values()) - sum(state.ends.values())
        backlog = sum(state.per_partition.values())
        # What left the lag: records that arrived, less the lag's growth.
        drained = arrived - (sum(per_partition.values()) - backlog)
        # An idle group drains nothing because nothing is there: that is no measurement.
        if drained > 0 or backlog > 0:
            mu = smooth(mu, max(drained, 0) / dt, smoothing)
        lam = smooth(lam, max(arrived, 0) / dt, smoothing)
        if drained > 0:
            moved_at = now
    if moved_at is None or not any(per_partition.values()):
        moved_at = now
    return LagState(
        read_at=now,
        ends=dict(reading.ends),
        per_partition=per_partition,
        consumer_lag=sum(consumer.values()),
        total=sum(per_partition.values()) + reading.unpublished,
        drain_rate=mu,
        arrival_rate=lam,
        moved_at=moved_at,
    )


def snapshot(
    state: LagState, *, now: float, stale_after_s: float, cause: str | None = None
) -> LagSnapshot:
    """The lag as ``state`` knows it at ``now``: unknown once older than ``stale_after_s``."""
    if state.read_at is None:
        return replace(UNKNOWN, cause=cause)
    age = now - state.read_at
    return LagSnapshot(  # O(1): the sums are made once per reading, in advance()
        known=age <= stale_after_s,
        lag=state.total,
        per_partition=state.per_partition,
        drain_rate=state.drain_rate,
        arrival_rate=state.arrival_rate,
        age_s=age,
        cause=cause,
        stalled_s=0.0 if state.moved_at is None else state.read_at - state.moved_at,
    )
