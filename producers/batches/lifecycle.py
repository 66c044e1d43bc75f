"""A batch's life after it is stored, as OpenAI's Batch API shows it: a batch made from an
uploaded file is ``validating`` until its lines are checked (``failed`` with OpenAI's
per-line ``errors``, or ``in_progress`` with its jobs, held for the meter); once every job
ended it is ``finalizing`` while its output and error files are written as stored files
(purpose ``batch_output``), then ``completed``, ``expired`` or ``cancelled``.

Every API process runs it beside the meter, since the API holds the files and the meter
its jobs go to. A round runs when a batch is created, when a job ends (the jobs channel's
NOTIFY) and every ``interval_s``: that sweep picks up what a restarted or crashed API left
``validating`` or ``finalizing``, since each step is one transaction on a row taken with
SKIP LOCKED (the state is the rows', never the process's). A round first asks, in one
statement, whether any batch waits for a step; with an ``Activity`` (the API's: what it
hears of batch jobs), a round that found none waiting is followed by a wait of up to
``QUIET_S`` unless something is heard first. One that found a batch waiting but could not
take it (held by another transaction) is followed by an interval.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from plumbing.activity import Activity
from plumbing.retry import in_rounds
from producers.batches.lifecycle_repository import Checker, LifecycleStore

log = logging.getLogger(__name__)

MIN_GAP_S = 0.1  # rounds are at least this far apart (job ends come in bursts)


class Lifecycle:
    def __init__(
        self,
        store: LifecycleStore,
        checker: Checker,
        *,
        interval_s: float,
        released: Callable[[], None] = lambda: None,
        activity: Activity | None = None,
    ) -> None:
        """``checker`` makes the line checker of a batch (from its endpoint);
        ``released``: called when a batch went in progress (its jobs wait for the meter)."""
        self._store = store
        self._checker = checker
        self._interval_s = interval_s
        self._released = released
        self._activity = activity
        self._wake = asyncio.Event()

    def wake(self) -> None:
        """A batch was created, or a job ended: a round now."""
        self._wake.set()

    async def step(self) -> int | None:
        """One round: validate every batch waiting, then finalize every batch whose jobs
        all ended; how many batches changed status (None: none waited for a step)."""
        if not await self._store.pending():
            return None
        changed = 0
        while (validated := await self._store.validate_next(self._checker)) is not None:
            batch_id, status = validated
            log.info("batch %s: validated, %s", batch_id, status)
            if status == "in_progress":
                self._released()
            changed += 1
        changed += await self._store.mark_finalizing()
        while (ended := await self._store.finalize_next()) is not None:
            log.info("batch %s: finalized, %s", *ended)
            changed += 1
        return changed

    async def run(self, stop: asyncio.Event) -> None:
        await in_rounds(
            "batch_lifecycle",
            self.step,
            stop,
            self._wake,
            interval_s=self._interval_s,
            min_gap_s=MIN_GAP_S,
            logger=log,
            name="batch lifecycle",
            # Quiet only when no batch waited: one that waited and did not change was held
            # by another transaction (another API's round, the webhook dispatcher's lock on
            # a batch whose job ended), and nothing will be heard when it lets go of it.
            quiet=lambda changed: changed is None,
            activity=self._activity,
        )
