"""The reconciler: finds jobs whose dispatch record is gone and dispatches them again.

The relay records where the broker put each job's newest dispatch record: the broker
cluster's id, the partition and the offset. Every ``reconcile_interval_s`` the reconciler
reads the broker's view of the dispatch topic (``TopicViewReader``: cluster id; first,
end and worker-group committed offset per partition), asks the store for the jobs whose
record that view takes for gone, reads the view again, and keeps those both views take for
gone (the rule: ``producers.outbox.rule``).

A ``dispatched`` job whose record is gone gets a new one at once; a ``running`` job only
once its attempt has run ``reconcile_running_after_s`` (its worker may still be decoding; a
new record makes a new attempt that fences the old one). The new dispatch record goes through
the outbox like any other, conditional on the position still being the one judged.

A pass whose first view is the one of the last pass, which found no suspect, less than
``QUIET_S`` ago, asks PostgreSQL nothing: with the broker's cluster id, first offsets, ends
and commit points
unchanged no record can have gone since, and no job been dispatched (the relay would have
moved an end). Only a running job's age can make a new suspect: it waits ``QUIET_S`` more
at most, against ``reconcile_running_after_s``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Protocol

from plumbing.activity import QUIET_S
from plumbing.retry import count as count_retry
from plumbing.retry import outage, wait_first
from producers.metrics import RECONCILED
from producers.outbox import rule
from producers.outbox.config import OutboxConfig
from producers.outbox.rule import Lost, Position, TopicView

log = logging.getLogger(__name__)


class TopicViewSource(Protocol):
    """What reads the broker's view of the dispatch topic (``TopicViewReader``)."""

    async def read(self) -> TopicView: ...

    async def close(self) -> None: ...


class ReconcilerStore(Protocol):
    """The reconciler's queries (``OutboxStore``)."""

    async def reset_ends(
        self, cluster_id: str | None = None, ends: dict[int, int] | None = None
    ) -> int: ...

    async def suspects(
        self, view: TopicView, *, partitions: int, running_since: datetime
    ) -> Mapping[str, tuple[Position, bool]]: ...

    async def redispatch_lost(self, lost: Lost) -> int: ...


class Reconciler:
    def __init__(
        self, config: OutboxConfig, store: ReconcilerStore, reader: TopicViewSource
    ) -> None:
        self._relay = config.relay
        self._partitions = config.kafka.partitions
        self._store = store
        self._reader = reader
        self._quiet: tuple[TopicView, float] | None = None  # a view with no suspect, when

    async def run(self, stop: asyncio.Event) -> None:
        try:
            while not stop.is_set():
                try:
                    await self.once()
                except Exception as exc:
                    if count_retry("reconcile", exc, outage) is None:
                        raise
                    log.warning("reconciler: cannot reconcile now: %r", exc)
                await wait_first(stop, limit_s=self._relay.reconcile_interval_s)
        finally:
            await self._reader.close()

    async def once(self) -> int:
        """One pass; returns how many jobs were dispatched again."""
        s = self._relay
        async with asyncio.timeout(max(s.reconcile_interval_s, 30.0)):
            before = await self._reader.read()
            if self._unchanged(before):
                return 0
            self._quiet = None
            await self._fix_ends(before)
            running_since = datetime.now(UTC) - timedelta(seconds=s.reconcile_running_after_s)
            suspects = await self._store.suspects(
                before, partitions=self._partitions, running_since=running_since
            )
            if not suspects:
                self._quiet = (before, time.monotonic())
                return 0
            after = await self._reader.read()
        done = 0
        for chunk in rule.chunks(rule.lost(suspects, after)):
            done += await self._store.redispatch_lost(chunk)
        if done:
            RECONCILED.inc(done)
            log.warning("reconciler: %d jobs had lost their dispatch record; sent again", done)
        return done

    def _unchanged(self, view: TopicView) -> bool:
        """The view of the last pass, which found no suspect less than QUIET_S ago."""
        quiet = self._quiet
        return quiet is not None and quiet[0] == view and time.monotonic() - quiet[1] < QUIET_S

    async def _fix_ends(self, view: TopicView) -> None:
        """Recorded partition ends of another cluster would keep the lag huge (the new
        cluster's commit points start again at zero): replace them with this cluster's."""
        if view.cluster_id is None:
            return
        void = await self._store.reset_ends(view.cluster_id, view.end)
        if void:
            log.warning(
                "reconciler: the broker's cluster id is new (%s); partition ends reset",
                view.cluster_id,
            )
