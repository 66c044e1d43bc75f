"""Apache Kafka stopped for longer than the relay's delivery timeout (`relay_send_timeout_s`;
aiokafka's idempotent producer has none of its own: it retries a record until the broker
takes it) while jobs are accepted and run: frozen (SIGSTOP: connections stay open and go
silent) or shut down (SIGTERM: refused), then back on the same log. The relay gives up on
the round, drops the producer and publishes the rows again with a new one; every job ends
exactly once."""

from __future__ import annotations

import asyncio
import os
import signal
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

DOC = "A relay that waits forever on a broker that is gone holds up every job behind it. " * 6
SEND_TIMEOUT_S = 4.0
STOPPED_S = 20.0  # over the send timeout, the producer's close grace (5 s) and its request
# timeout (10 s) together


@pytest.mark.parametrize("how", ["frozen", "shut_down"])
async def test_the_broker_stopped_past_the_delivery_timeout(
    settings: Settings, db: AsyncEngine, broker: ApacheKafka, tmp_path: Path, how: str
) -> None:
    # The relay publishes every row (no publishing at once): its delivery timeout is what
    # this tests. A row the API failed to publish at once is the relay's after its grace
    # (tests/integration/test_publish_at_once.py).
    own = on_broker(settings, broker).model_copy(
        update={
            "reconcile_interval_s": 1.0,
            "relay_send_timeout_s": SEND_TIMEOUT_S,
            "publish_at_once": False,
        }
    )
    await ensure_topics(broker.bootstrap, own.topic_partitions())
    job = {"input": DOC, "max_tokens": 200, "ttl_s": 900}
    with roles(own, tmp_path) as started:
        relay = started.start("relay")
        workers = [
            started.start("worker", sim_time_scale=3.0, worker_group_instance_id=f"worker-{n}")
            for n in (1, 2)
        ]
        async with serve(own, db) as api:
            ids = await submit(api, 12, **job)
            await until(db, ids, lambda s: running(s) >= 2, 90)
            if how == "frozen":
                assert broker.pid is not None
                os.kill(broker.pid, signal.SIGSTOP)
            else:
                broker.stop()
            # Accepted while the last lag reading is fresh: they wait in the outbox.
            ids += await submit(api, 6, **job)
            await asyncio.sleep(STOPPED_S)
            if how == "frozen":
                assert broker.pid is not None
                os.kill(broker.pid, signal.SIGCONT)
            else:
                await broker.start()
            await until(db, ids, all_ended, 180)
        for role in (relay, *workers):
            assert role.process.poll() is None, role.output()[-2000:]

    result = await outcome(own, db, ids)
    gave_up = relay.output().count("relay_round: ")  # each retry of a failed round
    print(f"broker {how} {STOPPED_S:.0f} s: {result.summary()}, relay rounds failed {gave_up}")
    exactly_once(result, ids)
    assert gave_up > 0, "the relay met the stopped broker"
