"""The batch meter on the real database: held jobs released round-robin between tenants,
never past the room, expired unreleased once their deadline passes, one meter at a time;
and, through the API, a batch over the lag accepted whole and metered in beside single
submits."""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from plumbing.pools import Pools
from plumbing.settings import Settings
from producers.batches.input import chunked
from producers.batches.meter import room
from producers.batches.meter_repository import Backlog, MeterStore
from producers.batches.repository import BatchRequest, BatchStore
from schemas.envelopes import DispatchEnvelope
from schemas.jobs import JobKind
from schemas.tables import jobs, outbox
from tests.integration.rows import chat, new
from tests.integration.serving import serve

NOW = datetime.now(UTC)


async def hold(db: AsyncEngine, tenant: str, n: int, **options: Any) -> str:
    """A batch of ``n`` jobs stored (held) as the API stores one."""
    requests = [
        BatchRequest(custom_id=f"{tenant}-{i}", kind=JobKind.COMPLETE, input="x", max_tokens=4)
        for i in range(n)
    ]
    store = BatchStore(db, events_topic="t.events")
    view, _ = await store.create(
        new(tenant, **options),
        chunked(requests, chunk=7),  # several chunks
        endpoint=lambda: "/v1/completions",
        admit=lambda jobs, held: None,
    )
    return view.id


def meter(db: AsyncEngine) -> MeterStore:
    return MeterStore(db, dispatch_topic="t.dispatch", events_topic="t.events")


async def dispatched_tenants(db: AsyncEngine) -> list[str]:
    """The tenants of the dispatch records in the outbox, in publishing order."""
    async with db.connect() as conn:
        payloads = (
            await conn.execute(
                select(outbox.c.payload).where(outbox.c.topic == "t.dispatch").order_by(outbox.c.id)
            )
        ).scalars()
        return [DispatchEnvelope.model_validate_json(p).tenant for p in payloads]


async def states(db: AsyncEngine) -> Counter[tuple[str, bool]]:
    async with db.connect() as conn:
        rows = await conn.execute(select(jobs.c.state, jobs.c.held))
        return Counter((r.state, r.held) for r in rows)


async def test_tenants_take_turns_and_a_round_releases_no_more_than_asked(
    db: AsyncEngine,
) -> None:
    await hold(db, "big", 20)
    await hold(db, "small", 3)
    assert (await states(db)) == Counter({("queued", True): 23})
    done = await meter(db).round(lambda backlog: 8, NOW)
    assert (done.released, done.expired) == (8, 0)
    assert done.backlog == Backlog(jobs=0, batch_jobs=0)  # counted before the release
    # Turns: big, small, big, small, big, small, then big's own.
    assert await dispatched_tenants(db) == ["big", "small"] * 3 + ["big", "big"]
    done = await meter(db).round(lambda backlog: 100, NOW)
    assert done.released == 15
    assert done.backlog == Backlog(jobs=8, batch_jobs=8)
    assert (await states(db)) == Counter({("queued", False): 23})
    assert (await meter(db).round(lambda backlog: 100, NOW)).released == 0


async def test_the_room_keeps_the_backlog_under_soft_and_batches_under_their_fill(
    db: AsyncEngine,
) -> None:
    await hold(db, "a", 30)

    def rule(backlog: Backlog) -> int:
        return room(backlog, lag=0, soft=10, fill=6)

    assert (await meter(db).round(rule, NOW)).released == 6
    assert (await meter(db).round(rule, NOW)).released == 0  # the batches' fill is full
    async with db.begin() as conn:  # two of them end; a single submit arrives
        ended = select(jobs.c.id).where(~jobs.c.held).limit(2).scalar_subquery()
        await conn.execute(update(jobs).where(jobs.c.id.in_(ended)).values(state="succeeded"))
    assert (await meter(db).round(rule, NOW)).released == 2
    # A lag reading over the backlog (lag_measure=consumer) counts too.
    assert room(Backlog(jobs=4, batch_jobs=0), lag=9, soft=10, fill=6) == 1
    assert room(Backlog(jobs=12, batch_jobs=0), lag=0, soft=10, fill=6) == 0


async def test_two_meters_at_once_release_no_more_than_the_room(db: AsyncEngine) -> None:
    await hold(db, "a", 50)

    def rule(backlog: Backlog) -> int:
        return room(backlog, lag=0, soft=10, fill=10)

    rounds = await asyncio.gather(*(meter(db).round(rule, NOW) for _ in range(4)))
    assert sum(r.released for r in rounds) <= 10
    for _ in range(3):
        await meter(db).round(rule, NOW)
    assert (await states(db))[("queued", False)] == 10


async def test_held_jobs_past_their_deadline_expire_without_a_dispatch_record(
    db: AsyncEngine,
) -> None:
    late = await hold(db, "a", 4, deadline=NOW - timedelta(seconds=1))
    await hold(db, "a", 2)
    done = await meter(db).round(lambda backlog: 100, NOW)
    assert (done.expired, done.released) == (4, 2)
    async with db.connect() as conn:
        rows = (await conn.execute(select(jobs).where(jobs.c.batch_id == late))).mappings().all()
        events = await conn.scalar(
            select(func.count()).select_from(outbox).where(outbox.c.topic == "t.events")
        )
    assert {(r["state"], r["held"]) for r in rows} == {("expired", False)}
    assert {r["error"]["code"] for r in rows} == {"deadline_passed"}
    assert {r["error"]["stage"] for r in rows} == {"before_decode"}
    assert events == 4
    assert await dispatched_tenants(db) == ["a", "a"]  # only the two in time


async def test_a_cancelled_batchs_held_jobs_leave_the_meters_queue(
    settings: Settings, db: AsyncEngine
) -> None:
    batch = await hold(db, "a", 5)
    store = BatchStore(db, events_topic="t.events")
    view = await store.cancel("a", batch)
    assert view.counts == {"cancelled": 5}
    assert (await states(db)) == Counter({("cancelled", False): 5})
    assert (await meter(db).round(lambda backlog: 100, NOW)).released == 0


async def test_through_the_api_a_batch_over_lag_hard_is_metered_in_beside_single_submits(
    settings: Settings, db: AsyncEngine
) -> None:
    # soft 8, hard 10, fill 0.5: batch jobs take at most 4 places in the queue, whatever
    # the batch's size; single submits are admitted beside them up to soft.
    tuned = settings.model_copy(
        update={"lag_soft": 8, "lag_hard": 10, "batch_fill": 0.5, "admission_mode": "reject"}
    )
    async with serve(tuned, db) as api:
        r = await api.post(
            "/v1/batches",
            json={"requests": [chat(f"r{i}") for i in range(40)]},
            headers={"X-Sluicegate-Tenant": "acme"},
        )
        assert r.status_code == 201, r.text
        await until_released(db, 4)
        for _ in range(4):
            single = await api.post("/v1/jobs", json={"kind": "complete", "input": "hi"})
            assert single.status_code == 202, single.text
        refused = await api.post("/v1/jobs", json={"kind": "complete", "input": "hi"})
        assert refused.status_code == 429  # the queue is at soft: 4 batch jobs, 4 singles
        # Two batch jobs end (as a worker ends them): two more are released, no more.
        async with db.begin() as conn:
            ended = (
                select(jobs.c.id)
                .where(~jobs.c.held, jobs.c.batch_id.isnot(None))
                .limit(2)
                .scalar_subquery()
            )
            await conn.execute(update(jobs).where(jobs.c.id.in_(ended)).values(state="succeeded"))
        await until_released(db, 6)
    assert (await states(db))[("queued", True)] == 34


async def until_released(db: AsyncEngine, n: int, within_s: float = 10.0) -> None:
    """Until ``n`` batch jobs are released; then a few more meter intervals show no more."""
    async with asyncio.timeout(within_s):
        while await released(db) < n:
            await asyncio.sleep(0.05)
    await asyncio.sleep(1.0)  # two lag intervals and a NOTIFY's wake-up: nothing more
    assert await released(db) == n


async def released(db: AsyncEngine) -> int:
    async with db.connect() as conn:
        return int(
            await conn.scalar(select(func.count()).where(~jobs.c.held, jobs.c.batch_id.isnot(None)))
            or 0
        )


async def test_a_held_job_past_its_deadline_is_never_released(db: AsyncEngine) -> None:
    await hold(db, "a", 3, deadline=NOW - timedelta(seconds=1))
    done = await meter(db).round(lambda backlog: 100, NOW, expire=False)
    assert (done.released, done.expired) == (0, 0)  # left for the expiry step
    assert (await states(db)) == Counter({("queued", True): 3})


async def test_a_batch_of_two_models_is_split_across_their_pools(db: AsyncEngine) -> None:
    """Each line's job waits for its own model's pool: each pool's meter releases only its
    own held jobs into its topic, and counts only its own backlog."""
    pools = Pools(Settings(pools={"alpha": {}, "beta": {}}, dispatch_topic="t.dispatch"))
    requests = [
        BatchRequest(
            custom_id=f"line-{i}",
            kind=JobKind.COMPLETE,
            input="x",
            max_tokens=4,
            params={"model": "beta" if i % 3 == 0 else "alpha"},
        )
        for i in range(12)
    ]
    store = BatchStore(db, events_topic="t.events", topic_of=lambda m: pools.of(m).topic)
    await store.create(
        new("tenant"),
        chunked(requests, chunk=5),
        endpoint=lambda: "/v1/completions",
        admit=lambda jobs, held: None,
    )
    alpha, beta = pools
    meters = {
        p.model: MeterStore(db, dispatch_topic=p.topic, events_topic="t.events", first=p.first)
        for p in pools
    }
    done = await meters["beta"].round(lambda backlog: 100, NOW)
    assert (done.released, done.backlog) == (4, Backlog(jobs=0, batch_jobs=0))
    done = await meters["alpha"].round(lambda backlog: 100, NOW)
    assert (done.released, done.backlog) == (8, Backlog(jobs=0, batch_jobs=0))
    assert (await meters["beta"].round(lambda backlog: 100, NOW)).backlog == Backlog(
        jobs=4, batch_jobs=4
    )
    async with db.connect() as conn:
        rows = await conn.execute(select(outbox.c.topic, func.count()).group_by(outbox.c.topic))
        assert dict(rows.all()) == {alpha.topic: 8, beta.topic: 4}
        stored = await conn.execute(select(jobs.c.dispatch_topic, jobs.c.params))
        assert Counter((t, p["model"]) for t, p in stored) == Counter(
            {(alpha.topic, "alpha"): 8, (beta.topic, "beta"): 4}
        )
