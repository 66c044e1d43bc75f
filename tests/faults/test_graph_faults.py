"""Long documents (docs/graphs.md) under faults, the roles as processes: a worker killed
mid-map and mid-reduce, the API killed mid-burst of submits, the broker restarted empty
mid-graph. Every document accepted ends exactly once, succeeded, with its graph's usage,
one terminal event and one webhook delivery; its parts announce nothing, none is left
unended, none ends twice and no level of a graph is made twice."""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import RowMapping, select
from sqlalchemy.ext.asyncio import AsyncEngine

from plumbing.kafka import ensure_topics
from plumbing.settings import Settings
from schemas.tables import graphs, jobs, outbox, webhook_deliveries
from sluicegate.local.broker.apache import ApacheKafka
from sluicegate.local.broker.tansu import TansuBroker
from sluicegate.local.embedded import free_port
from tests.faults.outcomes import TERMINAL, all_ended, states, terminal_event, until
from tests.faults.processes import Role, Roles, answering, assigned, holds, roles
from tests.integration.serving import serve
from tests.support.brokers import on_broker, restart_on_a_lost_log
from tests.support.long_text import long_document

pytestmark = pytest.mark.timeout(180)

CONTEXT = 512  # the simulated engine's max_model_len
MAX_TOKENS = 80
WORDS = 1400  # 6 or 7 chunks, then 2 reduces, then 1: three levels at this context
SEEDS = 8  # long_document's seeds 1 to 8, each cut so
DOCUMENTS = 4
HOOK = "http://127.0.0.1:9/hook"  # refused (loopback), but each end makes its one delivery row
SLOW = 6.0  # sim_time_scale: a part decodes for a few seconds


def graphing(settings: Settings) -> Settings:
    return settings.model_copy(update={"sim_max_model_len": CONTEXT})


def document(n: int, **extra: object) -> dict[str, object]:
    text = long_document(WORDS, seed=n % SEEDS + 1)
    body = {"kind": "summarize", "input": text, "max_tokens": MAX_TOKENS, "ttl_s": 900}
    return {**body, "callback_url": HOOK, **extra}


async def submit(api: httpx.AsyncClient, count: int) -> list[str]:
    ids = []
    for n in range(count):
        r = await api.post("/v1/jobs", json=document(n))
        assert r.status_code == 202, r.text
        ids.append(str(r.json()["id"]))
    return ids


async def parts(db: AsyncEngine, documents: Sequence[str]) -> Sequence[RowMapping]:
    query = select(
        jobs.c.id,
        jobs.c.parent_id,
        jobs.c.level,
        jobs.c.seq,
        jobs.c.state,
        jobs.c.attempt,
        jobs.c.dispatch_partition,
        jobs.c.result,
    ).where(jobs.c.parent_id.in_(documents))
    async with db.connect() as conn:
        return (await conn.execute(query)).mappings().all()


async def running_on(
    db: AsyncEngine,
    documents: Sequence[str],
    partitions: Callable[[], set[int]],
    *,
    level: int,
    at_least: int,
    within_s: float,
) -> list[str]:
    """Until ``at_least`` parts of ``level`` or above run from the ``partitions()`` (a
    worker's, now); their ids."""
    async with asyncio.timeout(within_s):
        while True:
            held = partitions()
            found = [
                str(p["id"])
                for p in await parts(db, documents)
                if p["state"] == "running"
                and p["level"] >= level
                and p["dispatch_partition"] in held
            ]
            if len(found) >= at_least:
                return found
            await asyncio.sleep(0.2)


async def delivered(db: AsyncEngine, documents: Sequence[str], within_s: float) -> None:
    """Until the webhook dispatcher has made a delivery row for each document."""
    async with asyncio.timeout(within_s):
        while True:
            async with db.connect() as conn:
                subjects = set(await conn.scalars(select(webhook_deliveries.c.subject)))
            if subjects >= set(documents):
                return
            await asyncio.sleep(0.3)


@dataclass(frozen=True, kw_only=True)
class GraphOutcome:
    documents: Counter[str]  # by final state
    parts: Counter[str]  # by final state
    ran_twice: Counter[int]  # by level: parts that ran again under a newer attempt
    redispatched: int  # parts given a second dispatch record (the reconciler's)
    terminal_events: Counter[str]  # by document
    part_events: int  # event records of parts (none expected)
    deliveries: Counter[str]  # by document
    part_deliveries: int
    shapes: Counter[tuple[int, int]]  # graphs by (chunks, levels)
    usage_off: list[str]  # documents whose result lacks the usage of their parts
    made_twice: list[str]  # (document, level) whose jobs were made more than once

    def summary(self) -> str:
        return (
            f"documents {dict(self.documents)} (graphs by chunks and levels {dict(self.shapes)}), "
            f"parts {dict(self.parts)}, parts run twice "
            f"{sum(self.ran_twice.values())} (by level {dict(sorted(self.ran_twice.items()))}), "
            f"parts dispatched again {self.redispatched}, "
            f"terminal events {sum(self.terminal_events.values())} "
            f"(parts {self.part_events}), deliveries {sum(self.deliveries.values())} "
            f"(parts {self.part_deliveries})"
        )


async def graph_outcome(settings: Settings, db: AsyncEngine, documents: list[str]) -> GraphOutcome:
    found = await states(db, documents)
    children = await parts(db, documents)
    ids = {str(p["id"]) for p in children}
    async with db.connect() as conn:
        records = (await conn.execute(select(outbox.c.topic, outbox.c.key, outbox.c.payload))).all()
        subjects = Counter(str(s) for s in await conn.scalars(select(webhook_deliveries.c.subject)))
        results = {
            str(r.id): r.result
            for r in await conn.execute(
                select(jobs.c.id, jobs.c.result).where(jobs.c.id.in_(documents))
            )
        }
        rows = {
            str(g.job_id): g
            for g in await conn.execute(select(graphs).where(graphs.c.job_id.in_(documents)))
        }
    events = [r for r in records if r.topic == settings.events_topic]
    dispatches = Counter(r.key for r in records if r.topic == settings.dispatch_topic)
    return GraphOutcome(
        documents=Counter(state for state, _ in found.values()),
        parts=Counter(str(p["state"]) for p in children),
        ran_twice=Counter(p["level"] for p in children if p["attempt"] >= 2),
        redispatched=sum(dispatches[i] >= 2 for i in ids),
        terminal_events=Counter(
            r.key for r in events if r.key in found and terminal_event(r.payload)
        ),
        part_events=sum(r.key in ids for r in events),
        deliveries=Counter({d: n for d, n in subjects.items() if d in found}),
        part_deliveries=sum(n for s, n in subjects.items() if s in ids),
        shapes=Counter((g.chunks, g.level + 1) for g in rows.values()),
        usage_off=[
            d for d in documents if not has_graph_usage(results[d], rows.get(d), children, d)
        ],
        made_twice=made_twice(children),
    )


def has_graph_usage(
    result: dict[str, Any] | None, graph: Any, children: Sequence[RowMapping], document: str
) -> bool:
    """The document's result: the last summary with the usage summed over its parts (each
    counted once), and the shape of its graph, whose last level ended its one job."""
    own = [p for p in children if str(p["parent_id"]) == document]
    if not result or graph is None or not own:
        return False
    top = max(p["level"] for p in own)
    usage = {
        name: sum(int((p["result"] or {}).get(name) or 0) for p in own)
        for name in ("prompt_tokens", "output_tokens")
    }
    return (
        graph.chunks == sum(p["level"] == 0 for p in own)
        and result["prompt_tokens"] == usage["prompt_tokens"] == graph.prompt_tokens
        and result["output_tokens"] == usage["output_tokens"] == graph.output_tokens
        and result["graph"] == {"chunks": graph.chunks, "levels": top + 1}
        and (graph.level, graph.total, graph.ended) == (top, 1, 1)
    )


def made_twice(children: Sequence[RowMapping]) -> list[str]:
    """Each level of each graph holds its jobs once: seq 0 to n-1, none twice."""
    levels: dict[tuple[str, int], list[int]] = defaultdict(list)
    for p in children:
        levels[(str(p["parent_id"]), p["level"])].append(p["seq"])
    return [
        f"{d} level {n}" for (d, n), seqs in levels.items() if sorted(seqs) != [*range(len(seqs))]
    ]


def each_once(result: GraphOutcome, documents: list[str]) -> None:
    """0 lost, 0 doubled: every document succeeded with its graph's usage, one terminal event
    and one delivery; every part ended once, succeeded; the parts announced nothing."""
    summary = result.summary()
    assert result.documents == Counter({"succeeded": len(documents)}), summary
    assert set(result.parts) == {"succeeded"}, summary  # none left unended, none failed
    assert all(chunks >= 6 and levels >= 2 for chunks, levels in result.shapes), summary
    assert not result.made_twice, result.made_twice
    assert not result.usage_off, result.usage_off
    assert result.terminal_events == Counter(dict.fromkeys(documents, 1)), summary
    assert result.part_events == 0, summary
    assert result.deliveries == Counter(dict.fromkeys(documents, 1)), summary
    assert result.part_deliveries == 0, summary


async def ran_twice(db: AsyncEngine, ids: list[str]) -> int:
    return sum(attempt >= 2 for _, attempt in (await states(db, ids)).values())


async def two_workers(started: Roles) -> tuple[Role, Role]:
    """Two slow workers, both in the group before the documents come."""
    doomed = started.start("worker", sim_time_scale=SLOW)
    await assigned(doomed)
    survivor = started.start("worker", sim_time_scale=SLOW)
    await assigned(survivor)
    return doomed, survivor


async def kill_a_worker_at(
    settings: Settings, db: AsyncEngine, tmp_path: Path, level: int, at_least: int
) -> tuple[list[str], GraphOutcome]:
    """Documents on two workers; one killed once ``at_least`` parts of ``level`` or above
    run on it."""
    own = graphing(settings)
    with roles(own, tmp_path) as started:
        started.start("relay")
        started.start("webhooks")
        doomed, survivor = await two_workers(started)
        async with serve(own, db) as api:
            documents = await submit(api, DOCUMENTS)
            victims = await running_on(
                db, documents, lambda: holds(doomed), level=level, at_least=at_least, within_s=90
            )
            doomed.kill()
            await until(db, documents, all_ended, 150)
            await delivered(db, documents, within_s=60)
        assert survivor.process.poll() is None, survivor.output()[-2000:]
    assert await ran_twice(db, victims), "the killed worker's parts must have run again"
    return documents, await graph_outcome(own, db, documents)


async def test_a_worker_killed_mid_map(settings: Settings, db: AsyncEngine, tmp_path: Path) -> None:
    documents, result = await kill_a_worker_at(settings, db, tmp_path, level=0, at_least=3)
    print(f"worker killed mid-map: {result.summary()}")
    each_once(result, documents)


async def test_a_worker_killed_mid_reduce(
    settings: Settings, db: AsyncEngine, tmp_path: Path
) -> None:
    documents, result = await kill_a_worker_at(settings, db, tmp_path, level=1, at_least=1)
    print(f"worker killed mid-reduce: {result.summary()}")
    each_once(result, documents)


class Burst:
    """Callers each submitting documents one after another under their own idempotency
    keys: what was answered 202 (key -> id) and what had no answer when the API died."""

    def __init__(self) -> None:
        self.accepted: dict[str, str] = {}
        self.unknown: set[str] = set()

    async def caller(self, http: httpx.AsyncClient, n: int) -> None:
        for i in range(100):
            key = f"doc-{n}-{i}"
            try:
                r = await http.post("/v1/jobs", json=document(n + i, idempotency_key=key))
            except httpx.TransportError:
                self.unknown.add(key)
                return
            assert r.status_code == 202, r.text
            self.accepted[key] = str(r.json()["id"])


async def test_the_api_killed_mid_burst_of_documents(
    settings: Settings, db: AsyncEngine, tmp_path: Path
) -> None:
    own = graphing(settings).model_copy(update={"publish_at_once_grace_s": 1.0})
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    burst = Burst()
    with roles(own, tmp_path) as started:
        started.start("relay")
        started.start("webhooks")
        started.start("worker", sim_time_scale=1.0)
        api = started.start("api", api_port=port)
        await answering(f"{url}/healthz", within_s=60)
        async with httpx.AsyncClient(base_url=url, headers={"X-Sluicegate-Tenant": "t"}) as http:
            callers = [asyncio.create_task(burst.caller(http, n)) for n in range(1, 5)]
            async with asyncio.timeout(60):
                while len(burst.accepted) < DOCUMENTS:
                    await asyncio.sleep(0.01)
            api.kill()
            await asyncio.wait_for(asyncio.gather(*callers), 30)
        assert burst.unknown, "the kill must have cut submits off"
        stored = await by_key(db)
        assert {k: stored.get(k) for k in burst.accepted} == burst.accepted  # 0 lost
        cut_off = {k: stored[k] for k in burst.unknown if k in stored}

        # The API again: each key sent again is the job stored under it, or a new one.
        started.start("api", api_port=port)
        await answering(f"{url}/healthz", within_s=60)
        async with httpx.AsyncClient(base_url=url, headers={"X-Sluicegate-Tenant": "t"}) as http:
            for key in sorted(burst.unknown):
                n, i = (int(x) for x in key.split("-")[1:])
                r = await http.post("/v1/jobs", json=document(n + i, idempotency_key=key))
                assert r.status_code in (200, 202), r.text
                burst.accepted[key] = str(r.json()["id"])
        assert {k: burst.accepted[k] for k in cut_off} == cut_off
        stored = await by_key(db)
        assert stored == burst.accepted  # one job a key, nothing unanswered left over
        documents = list(stored.values())
        await until(db, documents, all_ended, 150)
        await delivered(db, documents, within_s=60)
    result = await graph_outcome(own, db, documents)
    print(
        f"API killed mid-burst: {len(burst.accepted)} documents ({len(burst.unknown)} cut off, "
        f"{len(cut_off)} of them stored before the kill): {result.summary()}"
    )
    each_once(result, documents)


async def by_key(db: AsyncEngine) -> dict[str, str]:
    """Idempotency key -> job id, of every document stored."""
    async with db.connect() as conn:
        rows = await conn.execute(
            select(jobs.c.idempotency_key, jobs.c.id).where(jobs.c.parent_id.is_(None))
        )
        return {str(key): str(job_id) for key, job_id in rows}


async def test_the_broker_restarts_empty_mid_graph(
    settings: Settings, db: AsyncEngine, lossy_broker: ApacheKafka | TansuBroker, tmp_path: Path
) -> None:
    broker = lossy_broker
    own = graphing(on_broker(settings, broker)).model_copy(update={"reconcile_interval_s": 1.0})
    await ensure_topics(broker.bootstrap, own.topic_partitions())
    with roles(own, tmp_path) as started:
        relay = started.start("relay")
        # At most six parts at a time: when the broker dies, some parts decode and the
        # others wait in the topic, dispatched but not started.
        worker = started.start("worker", sim_time_scale=SLOW, worker_max_running=6)
        async with serve(own, db) as api:
            documents = await submit(api, DOCUMENTS)
            waiting = await parts_waiting(db, documents, within_s=90)
            broker.kill()  # every record, offset and group is gone
            await asyncio.sleep(2.0)  # the roles meet a dead broker
            await restart_on_a_lost_log(broker)
            await ensure_topics(broker.bootstrap, own.topic_partitions())
            # The webhook dispatcher is not under test here: it starts on the new log, with
            # its topic made again (one that met the lost log either ended its process or
            # rejoined before the topic was back and held no partition of it for minutes).
            started.start("webhooks")
            await until(db, documents, all_ended, 150)
            await delivered(db, documents, within_s=60)
        assert relay.process.poll() is None, relay.output()[-2000:]
        assert worker.process.poll() is None, worker.output()[-2000:]
    assert "lost their dispatch record" in relay.output()
    result = await graph_outcome(own, db, documents)
    print(
        f"broker ({broker.info.kind}) restarted empty mid-graph, {len(waiting)} parts waiting "
        f"in the lost log: {result.summary()}"
    )
    assert result.redispatched, "the parts that waited in the lost log must be dispatched again"
    each_once(result, documents)


async def parts_waiting(db: AsyncEngine, documents: list[str], within_s: float) -> list[str]:
    """Until parts run and others wait dispatched; those waiting. No document has ended yet
    (its event is published after the broker is back)."""
    async with asyncio.timeout(within_s):
        while True:
            found = await parts(db, documents)
            waiting = [str(p["id"]) for p in found if p["state"] == "dispatched"]
            if waiting and any(p["state"] == "running" for p in found):
                ended = await states(db, documents)
                assert not any(state in TERMINAL for state, _ in ended.values()), ended
                return waiting
            await asyncio.sleep(0.2)
