"""Which broker `sluicegate up` runs, as a user sees it: Apache Kafka (a `kafka.Kafka` JVM,
its log in the data directory, kept across restarts of `up`), and Tansu where Java is
missing, with one line saying why."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import asyncpg
import pytest
from aiokafka.admin import AIOKafkaAdminClient

from schemas import constants
from tests.e2e.cli import run
from tests.e2e.stack import RunningStack, stack_env, submit, wait_terminal
from tests.support.topics import log_records

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

PARTITIONS = 4


async def committed_by_admin(bootstrap: str, within_s: float = 30, at_least: int = 0) -> int:
    """The worker group's committed offsets, summed, as the admin API reads them
    (OffsetFetch, what `kafka-consumer-groups --describe` shows), once they reach
    ``at_least``."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        async with asyncio.timeout(within_s):
            while True:
                offsets = await admin.list_consumer_group_offsets(constants.WORKER_GROUP)
                total = sum(
                    meta.offset
                    for tp, meta in offsets.items()
                    if tp.topic == constants.DISPATCH_TOPIC and meta.offset > 0
                )
                if total >= at_least:
                    return total
                await asyncio.sleep(0.3)
    finally:
        await admin.close()


async def dispatch_rows(url: str) -> int:
    conn = await asyncpg.connect(url)
    try:
        found = await conn.fetchval(
            "SELECT count(*) FROM outbox WHERE topic = $1", constants.DISPATCH_TOPIC
        )
        return int(found)
    finally:
        await conn.close()


def broker_command(stack: RunningStack) -> list[bytes]:
    pid = stack.broker["pid"]
    assert isinstance(pid, int)
    return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")


def test_up_on_apache_kafka_keeps_its_log_across_a_restart(stack_factory) -> None:
    first = stack_factory(workers=2, args=["--broker", "kafka"])
    assert (first.broker["kind"], first.broker["version"]) == ("kafka", "4.1.2")
    assert b"kafka.Kafka" in broker_command(first)
    banner = first.log_text()
    assert "Apache Kafka 4.1.2 (KRaft, log in" in banner
    ids = submit(first, 30)
    views = wait_terminal(first, ids)
    assert Counter(v["state"] for v in views.values()) == Counter({"succeeded": 30})
    # The workers' commits, through the admin API: every dispatch record.
    assert asyncio.run(committed_by_admin(first.bootstrap, at_least=30)) == 30
    assert first.stop() == 0

    second = stack_factory(workers=1, args=["--broker", "kafka"])
    assert b"kafka.Kafka" in broker_command(second)
    assert "re-dispatched" not in second.log_text()
    first_offsets, records = asyncio.run(
        log_records(second.bootstrap, constants.DISPATCH_TOPIC, PARTITIONS)
    )
    assert first_offsets == dict.fromkeys(range(PARTITIONS), 0)  # the log starts at 0
    assert records == Counter(dict.fromkeys(ids, 1))  # and holds every record, once
    assert asyncio.run(dispatch_rows(second.database_url)) == 30  # none sent again
    # The group's offsets went on from where they were.
    more = submit(second, 5)
    assert {v["state"] for v in wait_terminal(second, more).values()} == {"succeeded"}
    assert asyncio.run(committed_by_admin(second.bootstrap, at_least=35)) == 35
    assert second.stop() == 0


def test_without_java_up_runs_on_tansu_and_says_why_in_one_line(stack_factory) -> None:
    stack = stack_factory(workers=1, PATH="/nonexistent", JAVA_HOME="", SLUICEGATE_BROKER="auto")
    assert stack.broker["kind"] == "tansu"
    said = [line for line in stack.log_text().splitlines() if line.startswith("broker: ")]
    assert said == [
        "broker: Tansu, the memory-only fallback (Apache Kafka not used: java_missing: no "
        "java on PATH: Apache Kafka needs Java 17 or newer)"
    ]
    assert "Tansu 0.6 (memory only: its log is lost when it stops)" in stack.log_text()
    views = wait_terminal(stack, submit(stack, 3))
    assert {v["state"] for v in views.values()} == {"succeeded"}
    assert stack.stop() == 0


def test_asked_for_apache_kafka_without_java_up_refuses_in_one_line(tmp_path: Path) -> None:
    env = {**stack_env(tmp_path), "PATH": "/nonexistent", "JAVA_HOME": ""}
    ran = run("up", "--broker", "kafka", env=env, timeout_s=60)
    assert ran.code != 0
    assert ran.lines() == [
        "sluicegate: --broker kafka cannot run (java_missing): no java on PATH: Apache Kafka "
        "needs Java 17 or newer"
    ]
