"""The delivery loop's wakes, against an in-memory table that claims as the statement does
(``ClaimRepository``): a slot freed while a claim runs is not lost, a delivery whose wake
was missed is claimed within ``claim_every_s``, and an idle dispatcher claims only that
often."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field

from workers.webhooks.attempt_repository import Attempted, Recorded
from workers.webhooks.claim_repository import Claim, ClaimedDelivery, Endpoint, full_after
from workers.webhooks.dispatch import Dispatcher
from workers.webhooks.retry import AttemptResult, RetrySchedule, Verdict

SECRET = "whsec_" + base64.b64encode(b"k" * 24).decode()
HOOK: Endpoint = ("t", "http://receiver/hook")


@dataclass
class Row:
    id: str
    due_at: float  # loop time
    endpoint: Endpoint = HOOK
    attempts: int = 0
    state: str = "pending"


@dataclass
class Table:
    """Deliveries in memory, claimed as ``_CLAIM`` claims them. ``pause``: awaited inside
    each claim after ``busy`` was read, as a statement's round trip is."""

    rows: dict[str, Row] = field(default_factory=dict)
    claims: int = 0
    pause: Callable[[], Awaitable[None]] = lambda: asyncio.sleep(0)

    def add(self, delivery_id: str, due_in_s: float = 0.0) -> None:
        now = asyncio.get_running_loop().time()
        self.rows[delivery_id] = Row(delivery_id, now + due_in_s)

    @property
    def delivered(self) -> set[str]:
        return {r.id for r in self.rows.values() if r.state == "delivered"}

    async def claim(
        self, *, limit: int, per_endpoint: int, busy: Mapping[Endpoint, int], lease_s: float
    ) -> Claim:
        ends = list(busy.items())  # the statement's parameters: read before the round trip
        self.claims += 1
        await self.pause()
        now = asyncio.get_running_loop().time()
        load = dict(ends)
        pending = sorted(
            (r for r in self.rows.values() if r.state == "pending"), key=lambda r: r.due_at
        )
        picked: list[Row] = []
        for row in pending:
            free = load.get(row.endpoint, 0) < per_endpoint
            if row.due_at <= now and len(picked) < limit and free:
                load[row.endpoint] = load.get(row.endpoint, 0) + 1
                picked.append(row)
        rest = [r for r in pending if r not in picked]
        for row in picked:
            row.due_at, row.attempts = now + lease_s, row.attempts + 1
        open_rest = [r.due_at - now for r in rest if load.get(r.endpoint, 0) < per_endpoint]
        overdue = [now - r.due_at for r in rest if r.due_at <= now]
        claimed = [
            ClaimedDelivery(
                id=r.id,
                tenant=r.endpoint[0],
                url=r.endpoint[1],
                subject=r.id,
                event_type="job.succeeded",
                body="{}",
                attempt=r.attempts,
                secrets=(SECRET,),
            )
            for r in picked
        ]
        return Claim(
            claimed=claimed,
            disabled=[],
            wait_s=min(open_rest, default=None),
            due_for_s=max(overdue, default=None),
            full=full_after(ends, claimed, per_endpoint),
        )

    async def record(self, done: Sequence[Attempted]) -> set[str]:
        for a in done:
            self.rows[a.claimed.id].state = "delivered"
        return {a.claimed.id for a in done}

    async def give_up(
        self, claimed: ClaimedDelivery, answer: AttemptResult, verdict: Verdict
    ) -> Recorded:
        raise AssertionError("every attempt delivers here")

    async def give_up_disabled(self, delivery_ids: Sequence[str]) -> int:
        raise AssertionError("no endpoint is disabled here")


@dataclass
class Receiver:
    """Answers 204 once the test lets an attempt end (``end``), or at once (``hold``
    False)."""

    hold: bool = True
    waiting: dict[str, asyncio.Future[None]] = field(default_factory=dict)

    async def post(self, url: str, body: bytes, headers: Mapping[str, str]) -> AttemptResult:
        if self.hold:
            done = asyncio.get_running_loop().create_future()
            self.waiting[headers["webhook-id"]] = done
            await done
        return AttemptResult(status=204)

    def end(self, delivery_id: str) -> None:
        self.waiting.pop(delivery_id).set_result(None)


def dispatcher(
    table: Table, receiver: Receiver, *, per_endpoint: int, every_s: float
) -> Dispatcher:
    return Dispatcher(
        table,
        table,
        receiver,
        schedule=RetrySchedule(steps_s=(0.0, 1.0), retry_after_max_s=60.0),
        uniform=lambda low, high: low,
        timeout_s=5.0,
        max_in_flight=64,
        per_endpoint=per_endpoint,
        claim_every_s=every_s,
    )


async def settle(until: Callable[[], bool], within_s: float = 5.0) -> None:
    async with asyncio.timeout(within_s):
        while not until():
            await asyncio.sleep(0.005)


async def test_a_slot_freed_while_a_claim_runs_is_claimed_again() -> None:
    """Two in flight at most to the endpoint. The first attempt ends: a claim starts,
    counting the second one's slot as taken; the second ends while that claim runs. The
    claim fills one slot and leaves the endpoint full by its count, so the attempt it
    started is the only one left: its end must not be the last wake."""
    table, receiver = Table(), Receiver()
    for n in range(5):
        table.add(f"d{n}")
    gate: asyncio.Event | None = None

    async def pause() -> None:
        if gate is not None:
            await gate.wait()

    table.pause = pause
    d = dispatcher(table, receiver, per_endpoint=2, every_s=3600.0)  # no poll to lean on
    stop = asyncio.Event()
    loop = asyncio.create_task(d.run(stop))
    await settle(lambda: set(receiver.waiting) == {"d0", "d1"})

    gate = asyncio.Event()  # the next claim waits, as on a round trip
    claims = table.claims
    receiver.end("d0")
    await settle(lambda: table.claims == claims + 1)  # claiming, with d1 counted busy
    receiver.end("d1")  # ends while the claim runs
    await settle(lambda: table.delivered == {"d0", "d1"})
    gate.set()
    gate = None
    # Each attempt the test lets end frees a slot for the next delivery.
    for n in range(2, 5):
        await settle(lambda n=n: f"d{n}" in receiver.waiting)
        receiver.end(f"d{n}")
    await settle(lambda: table.delivered == {f"d{n}" for n in range(5)})
    stop.set()
    await loop


async def test_a_delivery_whose_wake_was_missed_is_claimed_within_claim_every_s() -> None:
    table, receiver = Table(), Receiver(hold=False)
    d = dispatcher(table, receiver, per_endpoint=4, every_s=0.2)
    stop = asyncio.Event()
    loop = asyncio.create_task(d.run(stop))
    await settle(lambda: table.claims >= 1)  # the first claim found nothing
    table.add("quiet")  # made with no NOTIFY, no due_in(): nothing wakes the loop
    await settle(lambda: table.delivered == {"quiet"}, within_s=5.0)
    stop.set()
    await loop


async def test_an_idle_dispatcher_claims_once_every_claim_every_s() -> None:
    table, receiver = Table(), Receiver(hold=False)
    d = dispatcher(table, receiver, per_endpoint=4, every_s=0.25)
    stop = asyncio.Event()
    loop = asyncio.create_task(d.run(stop))
    await asyncio.sleep(1.0)
    stop.set()
    await loop
    assert 1 <= table.claims <= 5  # at the start, then every 0.25 s: never in a spin


async def test_a_retry_coming_due_is_claimed_then_without_a_poll() -> None:
    table, receiver = Table(), Receiver(hold=False)
    d = dispatcher(table, receiver, per_endpoint=4, every_s=3600.0)
    stop = asyncio.Event()
    loop = asyncio.create_task(d.run(stop))
    await settle(lambda: table.claims >= 1)
    table.add("later", due_in_s=0.3)
    d.due_in(0.3)  # as the event handler says of a row it made
    await settle(lambda: table.delivered == {"later"})
    stop.set()
    await loop


async def test_the_oldest_due_delivery_left_waiting_is_measured() -> None:
    """One slot, three due: two wait behind the first, and the gauge says how long the
    oldest of them has been due; once all are sent it reads 0."""
    table, receiver = Table(), Receiver()
    for n in range(3):
        table.add(f"d{n}")
    d = dispatcher(table, receiver, per_endpoint=1, every_s=3600.0)
    stop = asyncio.Event()
    loop = asyncio.create_task(d.run(stop))
    await settle(lambda: "d0" in receiver.waiting)
    await asyncio.sleep(0.2)
    assert d.oldest_due_s() >= 0.2
    for n in range(3):
        await settle(lambda n=n: f"d{n}" in receiver.waiting)
        receiver.end(f"d{n}")
    await settle(lambda: len(table.delivered) == 3)
    await settle(lambda: d.oldest_due_s() == 0.0)
    stop.set()
    await loop
