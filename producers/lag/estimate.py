"""The lag as admission estimates it between two readings.

A lag reading counts the jobs committed before its PostgreSQL snapshot began, and none
admitted after; a burst inside one reading interval would be seen one interval late. So
this process counts what it admitted since, and the admission controller, which owns the
estimate, adds it to the reading. Two others report into it: the lag monitor (as each
reading begins and lands) and the batch meter (the held jobs it releases, and its own
count of the backlog, which is newer than the reading when it lands after it).

The bookkeeping is in tallies: ``tally()`` is how many admitted jobs are committed so far. A
reading that took the tally as its snapshot began includes exactly those; a reading handed
over by another replica has no tally of ours, and gets the tally of the last refresh that had
begun by the time that reading began.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable


class LagEstimate:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._admitted = 0  # admissions so far (their jobs committed or about to be)
        self._committed = 0  # of those, the ones whose job is committed
        self._reading_tally = 0  # the tally the last reading landed with
        self._refreshes: deque[tuple[float, int]] = deque(maxlen=256)  # (clock, tally)
        # The meter's last count of the backlog: (when, jobs, the tally before it). With the
        # open lag it is the same quantity as a reading, counted more often.
        self._count: tuple[float, int, int] | None = None

    def tally(self) -> int:
        """The admitted jobs committed so far (a count begun after this includes them)."""
        return self._committed

    # The API, for each admitted submit.

    def record_admission(self) -> None:
        self._admitted += 1

    def record_commit(self, jobs: int = 1) -> None:
        """The admitted jobs are committed: lag readings from now on include them."""
        self._committed += jobs

    def record_withdrawal(self, jobs: int = 1) -> None:
        """The admitted request stored no new job (it failed, or was an idempotent replay)."""
        self._admitted -= jobs

    # The batch meter.

    def record_release(self, jobs: int) -> None:
        """The meter released ``jobs`` held batch jobs into the outbox (committed): they
        count at once, as admitted single submits do."""
        self._admitted += jobs
        self._committed += jobs

    def record_count(self, jobs: int, tally: int) -> None:
        """The meter counted ``jobs`` in the backlog in PostgreSQL, after ``tally`` was read.
        Newer than the last reading, it replaces the reading's lag: a reading plus every job
        released since would ignore the jobs that ended meanwhile, and a fast drain would
        push that sum past ``lag_hard`` while the true lag stays under ``lag_soft``."""
        self._count = (self._clock(), jobs, tally)

    # The lag monitor.

    def record_refresh(self) -> None:
        """A reading begins: remember the tally, for a reading without one of its own."""
        self._refreshes.append((self._clock(), self._committed))

    def record_reading(self, tally: int | None, age_s: float) -> None:
        """A reading landed, begun ``age_s`` ago, with the tally its snapshot took (None: a
        reading another replica took)."""
        self._reading_tally = tally if tally is not None else self._tally_at(self._clock() - age_s)

    def _tally_at(self, began: float) -> int:
        """The tally as a reading begun at ``began`` saw it: from the last refresh that
        started by then (the oldest kept if none did: it counts more as unseen)."""
        while len(self._refreshes) > 1 and self._refreshes[1][0] <= began:
            self._refreshes.popleft()
        return self._refreshes[0][1] if self._refreshes else 0

    # The controller.

    def lag(self, reading_lag: int, reading_age_s: float) -> int:
        """The last reading's lag plus what was admitted since that reading began, or the
        meter's count plus what was admitted since it, when that count is newer."""
        estimate = reading_lag + max(0, self._admitted - self._reading_tally)
        if self._count is not None:
            at, jobs, tally = self._count
            if at > self._clock() - reading_age_s:  # counted after the reading began
                estimate = jobs + max(0, self._admitted - tally)
        return estimate
