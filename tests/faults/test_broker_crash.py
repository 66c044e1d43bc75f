"""kill -9 Apache Kafka mid-load and start it again on the same log, while the relay and two
workers run (none restarted): every job ends exactly once, and the reconciler sends nothing
again, for the log kept every record."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from plumbing.kafka import ensure_topics
from plumbing.settings import Settings
from sluicegate.local.broker.apache import ApacheKafka
from tests.faults.outcomes import all_ended, exactly_once, outcome, running, submit, until
from tests.faults.processes import roles
from tests.integration.serving import serve
from tests.support.brokers import on_broker

pytestmark = pytest.mark.timeout(300)

DOC = "A broker that dies keeps its log on disk; what it acknowledged is still there. " * 6


async def test_the_broker_killed_mid_load_comes_back_on_its_log(
    settings: Settings, db: AsyncEngine, broker: ApacheKafka, tmp_path: Path
) -> None:
    own = on_broker(settings, broker).model_copy(update={"reconcile_interval_s": 1.0})
    await ensure_topics(broker.bootstrap, own.topic_partitions())
    job = {"input": DOC, "max_tokens": 300, "ttl_s": 900}
    with roles(own, tmp_path) as started:
        relay = started.start("relay")
        workers = [
            started.start(
                "worker",
                sim_time_scale=3.0,
                worker_max_running=4,
                worker_group_instance_id=f"worker-{n}",
            )
            for n in (1, 2)
        ]
        async with serve(own, db) as api:
            ids = await submit(api, 24, **job)
            await until(db, ids, lambda s: running(s) >= 2, 90)
            cluster_before = broker.cluster_id()
            broker.kill()  # SIGKILL: no controlled shutdown, no flush
            ids += await submit(api, 6, **job)  # the API needs only PostgreSQL
            await asyncio.sleep(2.0)  # the relay and the workers meet a dead broker
            await broker.restart()
            assert broker.cluster_id() == cluster_before  # the same cluster, not a new one
            await until(db, ids, all_ended, 180)
        for role in (relay, *workers):
            assert role.process.poll() is None, role.output()[-2000:]

    result = await outcome(own, db, ids)
    print(f"broker killed and restarted on its log: {result.summary()}")
    exactly_once(result, ids)
    # Every record acknowledged before the kill was still in the log: nothing looked lost.
    assert result.redispatched() == 0, result.summary()
    assert "lost their dispatch record" not in relay.output()
