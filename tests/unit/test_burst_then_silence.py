"""Loops after a burst and then silence (issue 43, point 4), through their seams (no I/O):
the reconciler's passes over a broker view that changes in a burst and then stays the same,
and the API's round loops (the batch meter, the batch lifecycle) after a round that a burst
made fail. The last item of the burst is handled within the loop's bound."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime

from sqlalchemy.exc import TimeoutError as PoolTimeout

from plumbing.settings import Settings
from producers.batches import lifecycle, meter
from producers.batches.input import RequestChecker
from producers.batches.lifecycle import Lifecycle
from producers.batches.meter import Meter
from producers.batches.meter_repository import Backlog, Budget, MeterRound
from producers.lag.estimate import LagEstimate
from producers.outbox import rule
from producers.outbox.config import OutboxConfig
from producers.outbox.reconciler import Reconciler
from producers.outbox.rule import Position, TopicView
from tests.support.loops import running, within

SLACK_S = 2.0  # a loaded machine's delays: the bounds are liveness, not speed
INTERVAL_S = 0.2
SETTINGS = Settings(partitions=3, reconcile_interval_s=INTERVAL_S)
CONFIG = OutboxConfig(
    bootstrap="unused:9092", database_url="unused", kafka=SETTINGS.kafka, relay=SETTINGS.relay
)
# A pool that a burst exhausted: SQLAlchemy's error after pool_timeout (plumbing/db.py).
EXHAUSTED = "QueuePool limit of size 10 overflow 10 reached, connection timed out, timeout 10.00"


# The reconciler (producers/outbox/reconciler.py).


class Broker:
    """The dispatch topic as the reconciler's ``LogSource`` reads it: ``view`` until it is
    changed."""

    def __init__(self, view: TopicView) -> None:
        self.view = view
        self.reads = 0

    async def read(self) -> TopicView:
        self.reads += 1
        return self.view

    async def close(self) -> None:
        pass


class Positions:
    """The jobs' recorded dispatch positions, as the reconciler's store: a suspect is a job
    whose record the view takes for gone (the rule its SQL applies, ``TopicView.gone``; no job
    started); a job dispatched again gets a record at its partition's end, as the relay
    publishes it, so the broker's next view shows it. ``during_query`` runs in each query,
    after the suspects were found (what the broker does meanwhile)."""

    def __init__(self, broker: Broker, positions: dict[str, Position]) -> None:
        self.broker = broker
        self.positions = positions
        self.queries = 0
        self.again: list[str] = []
        self.during_query: Callable[[], None] = lambda: None

    async def reset_ends(
        self, cluster_id: str | None = None, ends: dict[int, int] | None = None
    ) -> int:
        return 0

    async def suspects(
        self, view: TopicView, *, partitions: int, running_since: datetime
    ) -> dict[str, tuple[Position, bool]]:
        self.queries += 1
        found = {j: (p, False) for j, p in self.positions.items() if view.gone(p, started=False)}
        self.during_query()
        return found

    async def redispatch_lost(self, lost: rule.Lost) -> int:
        for job_id, at in lost:
            assert self.positions[job_id] == at
            view = self.broker.view
            _, partition, _ = at
            end = view.end[partition]
            self.positions[job_id] = (view.cluster_id, partition, end)
            self.broker.view = replace(view, end={**view.end, partition: end + 1})
            self.again.append(job_id)
        return len(lost)


def in_the_log(per_partition: int) -> tuple[Broker, Positions]:
    """Every partition holds ``per_partition`` records, one job's each, none consumed."""
    view = TopicView(
        cluster_id="A",
        first=dict.fromkeys(range(3), 0),
        end=dict.fromkeys(range(3), per_partition),
        exact_end=True,
        committed=dict.fromkeys(range(3), 0),
    )
    broker = Broker(view)
    positions: dict[str, Position] = {
        f"{p}-{o}": ("A", p, o) for p in range(3) for o in range(per_partition)
    }
    return broker, Positions(broker, positions)


def retention_took(broker: Broker, first: int) -> set[str]:
    """The broker's retention deletes every partition's records before ``first``: the jobs
    whose record went."""
    broker.view = replace(broker.view, first=dict.fromkeys(range(3), first))
    return {f"{p}-{o}" for p in range(3) for o in range(first)}


async def quiet(broker: Broker, store: Positions) -> None:
    """Until the reconciler skips the database: two passes in a row read the view and
    neither queries."""
    since = [store.queries, broker.reads]

    async def skipping() -> bool:
        if store.queries != since[0]:
            since[:] = [store.queries, broker.reads]
        return broker.reads >= since[1] + 2

    await within(skipping, 4 * INTERVAL_S + SLACK_S, "passes that skip the database")


async def test_reconciler_dispatches_a_burst_of_lost_records_again_at_the_next_pass() -> None:
    """Bound: a job whose record is gone is dispatched again by the first pass after the
    broker's view shows it gone (within ``reconcile_interval_s``): after a burst of losses
    (retention deleting records in steps) and then a view that stays the same, the quiet
    skip (``QUIET_S``, a view unchanged since a pass with no suspect) never hides one."""
    broker, store = in_the_log(20)
    reconciler = Reconciler(CONFIG, store, broker)
    async with running(reconciler.run):
        await quiet(broker, store)
        lost: set[str] = set()
        for first in (5, 10, 15):  # a burst: the view changes at every step
            lost |= retention_took(broker, first)
            await asyncio.sleep(INTERVAL_S / 4)
        changed = time.monotonic()

        async def all_again() -> bool:
            return set(store.again) == lost

        await within(all_again, INTERVAL_S + SLACK_S, "every lost job sent again", since=changed)
        await quiet(broker, store)  # silence: the new view shows them, nothing more to do
    assert sorted(store.again) == sorted(lost)  # each once


async def test_reconciler_never_takes_a_view_that_changed_during_its_pass_for_quiet() -> None:
    """Bound: a record that goes while a pass runs (after its view was read, before the
    database answered) is dispatched again within the next pass (two
    ``reconcile_interval_s``): that pass's view is kept as quiet, but the next one differs."""
    broker, store = in_the_log(20)
    reconciler = Reconciler(CONFIG, store, broker)
    async with running(reconciler.run):
        await quiet(broker, store)
        lost: set[str] = set()

        def retention_meanwhile() -> None:
            store.during_query = lambda: None
            lost.update(retention_took(broker, 10))

        store.during_query = retention_meanwhile
        published = broker.view  # a job dispatched: the next pass reads a new view
        broker.view = replace(published, end={**published.end, 0: published.end[0] + 1})
        store.positions["new"] = ("A", 0, published.end[0])
        changed = time.monotonic()

        async def all_again() -> bool:
            return bool(lost) and set(store.again) == lost

        await within(
            all_again, 2 * INTERVAL_S + SLACK_S, "every lost job sent again", since=changed
        )
    assert sorted(store.again) == sorted(lost)


# The batch meter and the batch lifecycle (plumbing.retry.in_rounds).


class KnownLag:
    """Admission as the meter sees it: a lag it knows (none), and its estimate."""

    def __init__(self) -> None:
        self.estimate = LagEstimate()

    def current_lag(self) -> int | None:
        return 0


class ExhaustedMeterStore:
    """The meter's store whose first round finds the connection pool exhausted by a burst,
    then releases what the room allows of its held jobs."""

    def __init__(self, held: int) -> None:
        self.held = held
        self.rounds = 0

    async def round(self, budget: Budget, now: datetime, *, expire: bool = True) -> MeterRound:
        self.rounds += 1
        if self.rounds == 1:
            raise PoolTimeout(EXHAUSTED)
        backlog = Backlog(jobs=0, batch_jobs=0)
        wanted = budget(backlog)
        released = min(wanted, self.held)
        self.held -= released
        return MeterRound(wanted=wanted, released=released, expired=0, backlog=backlog)


async def test_meter_releases_held_jobs_within_an_interval_after_a_pool_timeout() -> None:
    """Bound: held jobs with room are released within ``interval_s`` (plus ``MIN_GAP_S``)
    of a round that failed, whatever the failure a burst caused (here every pooled
    connection taken for longer than ``pool_timeout``), and nothing else happening."""
    store = ExhaustedMeterStore(held=5)
    m = Meter(
        store,  # type: ignore[arg-type]
        KnownLag(),  # type: ignore[arg-type]
        soft=10,
        fill=1.0,
        interval_s=INTERVAL_S,
    )
    async with running(m.run):
        m.wake()  # a batch was created

        async def released() -> bool:
            return store.held == 0

        await within(released, INTERVAL_S + meter.MIN_GAP_S + SLACK_S, "the held jobs released")


class ExhaustedLifecycleStore:
    """The lifecycle's store whose first round finds the connection pool exhausted by a
    burst; then one batch, whose jobs all ended, is marked finalizing and finalized."""

    def __init__(self) -> None:
        self.rounds = 0
        self.ready = 1
        self.finalizing = 0
        self.completed = 0

    async def pending(self) -> bool:
        self.rounds += 1
        if self.rounds == 1:
            raise PoolTimeout(EXHAUSTED)
        return self.ready + self.finalizing > 0

    async def validate_next(self, checker: object) -> None:
        return None

    async def mark_finalizing(self, limit: int = 100) -> int:
        marked, self.ready = self.ready, 0
        self.finalizing += marked
        return marked

    async def finalize_next(self) -> tuple[str, str] | None:
        if not self.finalizing:
            return None
        self.finalizing -= 1
        self.completed += 1
        return "batch", "completed"


async def test_lifecycle_completes_a_batch_within_an_interval_after_a_pool_timeout() -> None:
    """Bound: a batch whose jobs all ended is completed within ``interval_s`` (plus
    ``MIN_GAP_S``) of a round that failed, whatever the failure a burst caused (here every
    pooled connection taken for longer than ``pool_timeout``), and nothing else happening."""
    store = ExhaustedLifecycleStore()
    lc = Lifecycle(
        store,  # type: ignore[arg-type]
        lambda endpoint: RequestChecker(SETTINGS.api, endpoint=endpoint),
        interval_s=INTERVAL_S,
    )
    async with running(lc.run):
        lc.wake()  # its last job ended

        async def completed() -> bool:
            return store.completed == 1

        await within(completed, INTERVAL_S + lifecycle.MIN_GAP_S + SLACK_S, "the batch completed")
