"""The lag monitor: how far the worker group is behind on the dispatch topic, and how fast
it drains.

Every ``interval_s`` it takes a reading through its source (``KafkaLagSource``: committed
offsets from the broker, the rest from PostgreSQL) and applies the lag rule
(``producers.lag.rule``) to it. Ends come from the relays' acknowledged sends (exact: they
are the only writers); committed offsets from the broker. A worker runs many jobs of a partition at
once and commits only up to its oldest unfinished one (invariant 5), so the consumer lag also
counts records whose jobs have already ended. With ``lag_measure = "open"`` (the default) the
lag is instead the records past the committed offset whose job has not ended: PostgreSQL
knows, since the relay records each job's dispatch position. Either way, accepted jobs the
relay has not published yet are added (they are backlog too).

The drain rate μ is the records leaving that lag per second, the arrival rate λ is from
end-offset movement, both smoothed. A reading older than ``stale_after_s`` is "unknown".
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Protocol

from aiokafka.errors import KafkaError
from sqlalchemy.exc import DBAPIError

from plumbing.retry import wait_first
from producers.lag import rule
from producers.lag.estimate import LagEstimate
from producers.lag.rule import LagSnapshot, LagState, Reading
from producers.metrics import ARRIVAL_RATE, CONSUMER_LAG, DRAIN_RATE, LAG, LAG_KNOWN
from schemas.constants import DEFAULT_MODEL

log = logging.getLogger(__name__)

Clock = Callable[[], float]


class LagSource(Protocol):
    async def read(self, tally: Callable[[], int]) -> Reading | None:
        """A new reading, or None when there is none since the last (the last one ages).
        ``tally`` is read as the reading's PostgreSQL snapshot begins (``Reading.tally``)."""
        ...


def cause_of(exc: BaseException) -> str:
    """Why a reading failed: "database_unavailable" or "broker_unavailable"."""
    database = isinstance(exc, DBAPIError | OSError) and not isinstance(exc, KafkaError)
    return "database_unavailable" if database else "broker_unavailable"


class LagMonitor:
    def __init__(
        self,
        source: LagSource,
        *,
        estimate: LagEstimate,
        interval_s: float,
        stale_after_s: float,
        smoothing: float = 0.3,
        clock: Clock = time.monotonic,
        model: str = DEFAULT_MODEL,
    ) -> None:
        """``model``: the pool's, the ``model`` label of its metrics."""
        self._source = source
        self.model = model
        self._interval_s = interval_s
        self._stale_after_s = stale_after_s
        self._alpha = smoothing
        self._clock = clock
        self._state = LagState()
        self._updated = asyncio.Event()
        self._cause: str | None = None
        # Told as each reading begins and lands, so that admission counts what it admitted
        # since (``producers.lag.estimate``).
        self._estimate = estimate

    @property
    def estimate(self) -> LagEstimate:
        """The estimate this monitor reports each reading into."""
        return self._estimate

    def update(
        self,
        ends: Mapping[int, int],
        committed: Mapping[int, int],
        unpublished: int = 0,
        open: Mapping[int, int] | None = None,
        age_s: float = 0.0,
    ) -> bool:
        """Take a new reading, begun ``age_s`` ago (the loop calls this; tests call it
        directly). False, and nothing changes, for a reading no newer than the last."""
        reading = Reading(ends, committed, unpublished, open)
        read_at = self._clock() - age_s
        if self._state.read_at is not None and read_at <= self._state.read_at:
            return False
        self._state = rule.advance(self._state, reading, now=read_at, smoothing=self._alpha)
        self._cause = None
        snapshot = self.snapshot()
        model = self.model
        CONSUMER_LAG.labels(model=model).set(self._state.consumer_lag)
        LAG.labels(model=model).set(snapshot.lag)
        LAG_KNOWN.labels(model=model).set(1)
        DRAIN_RATE.labels(model=model).set(snapshot.drain_rate or 0.0)
        ARRIVAL_RATE.labels(model=model).set(snapshot.arrival_rate or 0.0)
        self._updated.set()
        self._updated = asyncio.Event()
        return True

    def snapshot(self) -> LagSnapshot:
        return rule.snapshot(
            self._state, now=self._clock(), stale_after_s=self._stale_after_s, cause=self._cause
        )

    async def next_update(self, limit_s: float | None = None) -> None:
        """Wait for the next reading (or ``limit_s``)."""
        await wait_first(self._updated, limit_s=limit_s)

    async def refresh(self) -> bool:
        """One reading; False (and the old reading ages) when the lag cannot be read or
        there is no new one."""
        self._estimate.record_refresh()
        try:
            async with asyncio.timeout(self._stale_after_s):
                # A source that reads PostgreSQL takes the tally as its snapshot begins: a
                # tally taken before the broker is asked would count the jobs committed in
                # between twice (in the reading and as unseen).
                reading = await self._source.read(self._estimate.tally)
        except (KafkaError, OSError, TimeoutError, DBAPIError) as exc:
            log.warning("lag monitor: cannot read lag: %r", exc)
            self._cause = cause_of(exc)
            LAG_KNOWN.labels(model=self.model).set(1 if self.snapshot().known else 0)
            return False
        if reading is None:
            LAG_KNOWN.labels(model=self.model).set(1 if self.snapshot().known else 0)
            return False
        r = reading
        if not self.update(r.ends, r.committed, r.unpublished, r.open, age_s=r.age_s):
            return False
        self._estimate.record_reading(r.tally, r.age_s)
        return True

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.refresh()
            await wait_first(stop, limit_s=self._interval_s)
