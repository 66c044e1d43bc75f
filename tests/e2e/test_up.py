"""`sluicegate up` end to end, as a user runs it."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections import Counter

import asyncpg
import psutil
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from schemas import constants
from sluicegate.local.embedded import free_port
from tests.e2e.stack import submit, wait_state, wait_terminal

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


async def committed_total(bootstrap: str, partitions: int) -> int:
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=constants.WORKER_GROUP, enable_auto_commit=False
    )
    await consumer.start()
    try:
        total = 0
        for p in range(partitions):
            total += await consumer.committed(TopicPartition(constants.DISPATCH_TOPIC, p)) or 0
        return total
    finally:
        await consumer.stop()


async def dispatch_rows(url: str) -> Counter[str]:
    """Dispatch records the outbox holds, by job."""
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch(
            "SELECT key FROM outbox WHERE topic = $1", constants.DISPATCH_TOPIC
        )
        return Counter(r["key"] for r in rows)
    finally:
        await conn.close()


async def database_counts(url: str) -> tuple[Counter[str], int, int]:
    conn = await asyncpg.connect(url)
    try:
        states = Counter(
            {
                r["state"]: r["n"]
                for r in await conn.fetch("SELECT state, count(*) AS n FROM jobs GROUP BY state")
            }
        )
        attempts = await conn.fetchval("SELECT max(attempt) FROM jobs")
        events = await conn.fetchval(
            "SELECT count(*) FROM outbox WHERE topic = $1", constants.EVENTS_TOPIC
        )
        return states, attempts, events
    finally:
        await conn.close()


def test_fifty_jobs_end_to_end(stack_factory) -> None:
    stack = stack_factory(workers=2)
    ids = submit(stack, 50)
    views = wait_terminal(stack, ids)
    assert {v["state"] for v in views.values()} == {"succeeded"}
    for view in views.values():
        result = view["result"]
        assert result["engine"] == "sim"
        assert result["simulated"] is True
        assert result["text"]

    states, attempts, events = asyncio.run(database_counts(stack.database_url))
    assert states == Counter({"succeeded": 50})
    assert attempts == 1  # each ran exactly once
    assert events == 50  # one terminal event per job

    # Offsets: the workers committed past every dispatch record.
    committed = asyncio.run(committed_total(stack.bootstrap, 4))
    assert committed == 50

    assert stack.stop() == 0
    assert stack.descendants, "up should have started child processes"
    assert not [p for p in stack.descendants if p.is_running() and p.status() != "zombie"]


@pytest.mark.parametrize("broker", ["kafka", "tansu"])
def test_accepted_job_survives_a_restart_of_up(stack_factory, broker: str) -> None:
    first = stack_factory(workers=0, args=["--broker", broker])
    ids = submit(first, 3)
    wait_state(first, ids, "dispatched")  # their records are in the broker's log
    assert first.stop() == 0

    second = stack_factory(workers=1, args=["--broker", broker])
    views = wait_terminal(second, ids)
    assert {v["state"] for v in views.values()} == {"succeeded"}
    # Apache Kafka kept the dispatch records in its log: nothing is sent again. Tansu's
    # log died with it: each unfinished job got a new record, and the banner says so.
    redispatched = "3 unfinished jobs re-dispatched on its new log"
    assert (redispatched in second.log_text()) == (broker == "tansu")
    dispatches = asyncio.run(dispatch_rows(second.database_url))
    assert dispatches == Counter(dict.fromkeys(ids, 2 if broker == "tansu" else 1))


def test_a_second_up_on_the_same_data_dir_is_refused_and_touches_nothing(
    stack_factory, tmp_path
) -> None:
    first = stack_factory(workers=1)
    env = {
        **os.environ,
        "SLUICEGATE_DATA_DIR": str(tmp_path),
        "SLUICEGATE_API_PORT": str(free_port()),
    }
    for key in ("SLUICEGATE_DATABASE_URL", "SLUICEGATE_KAFKA_BOOTSTRAP_SERVERS"):
        env.pop(key, None)
    second = subprocess.run(
        [sys.executable, "-m", "sluicegate", "up", "--workers", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert second.returncode != 0
    said = (second.stdout + second.stderr).strip().splitlines()
    assert len(said) == 1, said
    assert "already runs" in said[0]
    assert f"pid {first.process.pid}" in said[0]
    assert first.api_url in said[0]
    # The first stack goes on as if nothing happened: its database, its workers.
    views = wait_terminal(first, submit(first, 3))
    assert {v["state"] for v in views.values()} == {"succeeded"}
    assert first.stop() == 0


def test_up_after_up_was_killed_takes_the_data_dir_back(stack_factory) -> None:
    first = stack_factory(workers=0)
    ids = submit(first, 2)
    left = psutil.Process(first.process.pid).children(recursive=True)
    first.process.kill()  # kill -9: its children and its PostgreSQL keep running
    first.process.wait()
    assert any(p.is_running() and p.status() != "zombie" for p in left)

    second = stack_factory(workers=1)
    assert "processes a dead stack left running" in second.log_text()
    views = wait_terminal(second, ids)  # accepted before the kill: not lost
    assert {v["state"] for v in views.values()} == {"succeeded"}
    assert not [p for p in left if p.is_running() and p.status() != "zombie"]
    assert second.stop() == 0
