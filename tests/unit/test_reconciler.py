"""When the reconciler takes a dispatch record for gone, which suspects it dispatches again,
and its pass over a fake broker view and store (no I/O)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from plumbing.settings import Settings
from producers.outbox import rule
from producers.outbox.config import OutboxConfig
from producers.outbox.reconciler import Reconciler
from producers.outbox.rule import Position, TopicView

VIEW = TopicView(cluster_id="A", first={0: 10}, end={0: 50}, exact_end=True, committed={0: 30})


@pytest.mark.parametrize(
    ("position", "started", "gone"),
    [
        (("A", 0, 40), False, False),  # waiting in the partition, after the commit point
        (("A", 0, 40), True, False),
        (("B", 0, 40), False, True),  # written to another cluster
        (("B", 0, 40), True, True),
        ((None, 0, 40), False, True),
        (("A", 0, 9), True, True),  # before the first offset: retention took it
        (("A", 0, 50), True, True),  # at or past the end: truncated
        (("A", 0, 20), False, True),  # the group committed past it, the job never started
        (("A", 0, 20), True, False),  # started: its worker has it
    ],
)
def test_gone(position: tuple[str | None, int, int], started: bool, gone: bool) -> None:
    assert VIEW.gone(position, started=started) is gone


def test_an_inexact_end_is_not_evidence() -> None:
    tansu = TopicView(cluster_id="A", first={0: 0}, end={0: 1}, exact_end=False, committed={0: 0})
    assert not tansu.gone(("A", 0, 5), started=False)


def test_a_suspect_is_lost_only_if_the_second_view_agrees() -> None:
    before = TopicView(
        cluster_id="A", first={0: 10}, end={0: 50}, exact_end=True, committed={0: 30}
    )
    after = TopicView(cluster_id="A", first={0: 0}, end={0: 60}, exact_end=True, committed={0: 30})
    suspects = {
        "published-meanwhile": (("A", 0, 55), False),  # past the end before, in the partition after
        "retention": (("A", 0, 5), True),  # before the first offset in one view only
        "skipped": (("A", 0, 20), False),  # the group committed past it: both agree
        "other-cluster": (("B", 0, 40), True),
    }
    assert rule.lost(suspects, after) == [
        ("skipped", ("A", 0, 20)),
        ("other-cluster", ("B", 0, 40)),
    ]
    assert rule.lost({}, before) == []


def test_lost_jobs_go_in_chunks() -> None:
    jobs: rule.Lost = [(str(n), ("A", 0, n)) for n in range(5)]
    assert [len(c) for c in rule.chunks(jobs, 2)] == [2, 2, 1]
    assert [c for chunk in rule.chunks(jobs, 2) for c in chunk] == jobs
    assert list(rule.chunks([], 2)) == []
    assert [len(c) for c in rule.chunks([(str(n), ("A", 0, n)) for n in range(2500)])] == [
        1000,
        1000,
        500,
    ]


class Views:
    """A LogSource that answers the views given, in turn."""

    def __init__(self, *views: TopicView) -> None:
        self.views = list(views)
        self.reads = 0
        self.closed = False

    async def read(self) -> TopicView:
        self.reads += 1
        return self.views.pop(0)

    async def close(self) -> None:
        self.closed = True


class Store:
    """A ReconcilerStore that remembers what it was asked."""

    def __init__(self, suspects: dict[str, tuple[Position, bool]], void: int = 0) -> None:
        self.found = suspects
        self.void = void
        self.resets: list[tuple[str | None, dict[int, int] | None]] = []
        self.asked: list[tuple[TopicView, int, datetime]] = []
        self.redispatched: list[rule.Lost] = []

    async def reset_ends(
        self, cluster_id: str | None = None, ends: dict[int, int] | None = None
    ) -> int:
        self.resets.append((cluster_id, ends))
        return self.void

    async def suspects(
        self, view: TopicView, *, partitions: int, running_since: datetime
    ) -> dict[str, tuple[Position, bool]]:
        self.asked.append((view, partitions, running_since))
        return self.found

    async def redispatch_lost(self, lost: rule.Lost) -> int:
        self.redispatched.append(lost)
        return len(lost)


SETTINGS = Settings(partitions=3, reconcile_running_after_s=120.0, reconcile_interval_s=5.0)
CONFIG = OutboxConfig(
    bootstrap="unused:9092", database_url="unused", kafka=SETTINGS.kafka, relay=SETTINGS.relay
)


async def test_no_suspect_needs_no_second_view() -> None:
    views = Views(VIEW)
    store = Store({})
    assert await Reconciler(CONFIG, store, views).once() == 0
    assert views.reads == 1
    assert store.redispatched == []
    view, partitions, running_since = store.asked[0]
    assert (view, partitions) == (VIEW, 3)
    age = datetime.now(UTC) - running_since
    assert timedelta(seconds=119) < age < timedelta(seconds=121)


async def test_only_what_both_views_take_for_gone_is_sent_again() -> None:
    after = replace(VIEW, end={0: 60})  # the record at 55 was published meanwhile
    store = Store({"late": (("A", 0, 55), False), "skipped": (("A", 0, 20), False)})
    views = Views(replace(VIEW, end={0: 50}), after)
    assert await Reconciler(CONFIG, store, views).once() == 1
    assert store.redispatched == [[("skipped", ("A", 0, 20))]]


async def test_the_ends_of_another_cluster_are_reset_to_this_ones() -> None:
    store = Store({}, void=2)
    await Reconciler(CONFIG, store, Views(VIEW)).once()
    assert store.resets == [("A", {0: 50})]
    nameless = Store({})
    await Reconciler(CONFIG, nameless, Views(replace(VIEW, cluster_id=None))).once()
    assert nameless.resets == []  # a view that names no cluster id cannot tell


async def test_run_closes_its_reader() -> None:
    views = Views(VIEW)
    stop = asyncio.Event()
    stop.set()
    await Reconciler(CONFIG, Store({}), views).run(stop)
    assert views.closed
