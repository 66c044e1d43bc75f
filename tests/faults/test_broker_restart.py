"""The broker dies and comes back empty while the relay and a worker run (Tansu keeps its log
in memory; Apache Kafka here loses its disk): jobs accepted but not yet published, jobs
dispatched but not started, and jobs decoding all end exactly once; the processes are not
restarted, and the reconciler in the relay process finds the jobs whose dispatch record is
gone."""

from __future__ import annotations

import asyncio
import signal
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from plumbing.kafka import ensure_topics
from plumbing.settings import Settings
from schemas.states import TERMINAL_STATES
from schemas.tables import outbox
from sluicegate.local.broker.apache import ApacheKafka
from sluicegate.local.broker.tansu import TansuBroker
from tests.faults.outcomes import DOC, states, terminal_event, until
from tests.faults.processes import roles
from tests.integration.serving import serve
from tests.support.brokers import on_broker, restart_on_a_lost_log

pytestmark = pytest.mark.timeout(300)

JOBS = 24
WHILE_FROZEN = 6


def running(states: dict[str, tuple[str, int]]) -> int:
    return sum(state == "running" for state, _ in states.values())


def dispatched(states: dict[str, tuple[str, int]]) -> int:
    return sum(state == "dispatched" for state, _ in states.values())


async def submit(api: object, count: int) -> list[str]:
    ids = []
    for _ in range(count):
        r = await api.post(  # type: ignore[attr-defined]
            "/v1/jobs",
            json={"kind": "complete", "input": DOC, "max_tokens": 300, "ttl_s": 900},
        )
        assert r.status_code == 202, r.text
        ids.append(r.json()["id"])
    return ids


async def test_the_broker_restarts_empty_while_workers_run(
    settings: Settings, db: AsyncEngine, lossy_broker: ApacheKafka | TansuBroker, tmp_path: Path
) -> None:
    broker = lossy_broker
    own = on_broker(settings, broker).model_copy(update={"reconcile_interval_s": 1.0})
    await ensure_topics(broker.bootstrap, own.topic_partitions())
    terminal = {s.value for s in TERMINAL_STATES}
    with roles(own, tmp_path) as started:
        relay = started.start("relay")
        # One slow worker that runs at most four jobs at a time: when the broker dies,
        # some jobs decode and the rest wait in the topic, dispatched but not started.
        worker = started.start("worker", sim_time_scale=3.0, worker_max_running=4)
        async with serve(own, db) as api:
            ids = await submit(api, JOBS)
            # The relay marks jobs dispatched as the broker acknowledges them: the worker can
            # be running two before the rest are, so both are waited for.
            await until(db, ids, lambda s: running(s) >= 2 and dispatched(s) >= 1, 90)
            waiting = [j for j, (st, _) in (await states(db, ids)).items() if st == "dispatched"]
            assert waiting, "some jobs must be dispatched but not started when the broker dies"

            # Between accept and dispatch: the relay is frozen while jobs are accepted.
            relay.process.send_signal(signal.SIGSTOP)
            ids += await submit(api, WHILE_FROZEN)
            broker.kill()  # every record, offset and group is gone
            relay.process.send_signal(signal.SIGCONT)
            await asyncio.sleep(2.0)  # the relay and the worker meet a dead broker
            await restart_on_a_lost_log(broker)
            await ensure_topics(broker.bootstrap, own.topic_partitions())

            await until(db, ids, lambda s: all(st in terminal for st, _ in s.values()), 180)
        assert relay.process.poll() is None, relay.output()[-2000:]
        assert worker.process.poll() is None, worker.output()[-2000:]

    final = await states(db, ids)
    assert Counter(st for st, _ in final.values()) == Counter({"succeeded": len(ids)})
    async with db.connect() as conn:
        records = (await conn.execute(select(outbox.c.topic, outbox.c.key, outbox.c.payload))).all()
    dispatches = Counter(r.key for r in records if r.topic == own.dispatch_topic)
    # The jobs that waited in the lost log were found by the reconciler: a second record.
    assert all(dispatches[j] >= 2 for j in waiting), {j: dispatches[j] for j in waiting}
    assert "lost their dispatch record" in relay.output()
    ends = Counter(r.key for r in records if r.key in final and terminal_event(r.payload, terminal))
    assert ends == Counter(dict.fromkeys(ids, 1))  # one terminal event per job
