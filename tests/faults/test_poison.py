"""Poison on the dispatch topic (not JSON, a wrong schema version, an unknown job, a huge
record): each is dead-lettered with its reason, the worker goes on past it, and the
group's committed offsets reach the end of the log (the lag does not stick)."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from plumbing.settings import Settings
from schemas.envelopes import DeadRecord, DispatchEnvelope
from schemas.jobs import JobKind, Priority
from schemas.tables import dead_letters
from tests.faults.outcomes import DOC, states, until
from tests.faults.processes import roles
from tests.integration.serving import serve
from tests.support.topics import caught_up, read_until

pytestmark = pytest.mark.timeout(180)

# Far over the worker's fetch size (64 KiB here) and just under what Apache Kafka takes in a
# record by default (message.max.bytes, 1 MiB + 12 B): a bigger one is refused at produce.
HUGE = 1_000_000


def envelope(job_id: str) -> DispatchEnvelope:
    return DispatchEnvelope(
        job_id=job_id,
        tenant="default",
        kind=JobKind.SUMMARIZE,
        priority=Priority.NORMAL,
        max_tokens=16,
        prompt_tokens=10,
        deadline=datetime.now(UTC) + timedelta(minutes=10),
    )


async def produce(settings: Settings, values: list[bytes]) -> None:
    producer = AIOKafkaProducer(
        bootstrap_servers=settings.require_kafka(),
        max_request_size=4 * HUGE,
        enable_idempotence=False,
    )
    await producer.start()
    try:
        for value in values:
            await producer.send_and_wait(settings.dispatch_topic, value, partition=0)
    finally:
        await producer.stop()


async def test_poison_is_dead_lettered_and_the_worker_goes_on(
    settings: Settings, db: AsyncEngine, tmp_path: Path
) -> None:
    unknown = str(uuid.uuid4())
    wrong_version = json.loads(envelope(str(uuid.uuid4())).to_bytes()) | {"v": 99}
    poison = [
        b"\x00\xffnot json at all",
        json.dumps(wrong_version).encode(),
        envelope(unknown).to_bytes(),
        b'{"pad": "' + b"x" * HUGE + b'"}',
    ]
    with roles(settings, tmp_path) as started:
        async with serve(settings, db) as api:
            r = await api.post("/v1/jobs", json={"kind": "summarize", "input": DOC})
            assert r.status_code == 202, r.text
            job_id = r.json()["id"]
            # The poison, then a good record for the same partition behind it.
            await produce(settings, [*poison, envelope(job_id).to_bytes()])
            started.start("relay")
            started.start("worker", worker_fetch_bytes=64 * 1024)
            await until(db, [job_id], lambda s: s[job_id][0] == "succeeded", 90)
            await caught_up(
                settings.require_kafka(),
                settings.consumer_group,
                settings.dispatch_topic,
                settings.partitions,
            )

    async with db.connect() as conn:
        rows = (
            await conn.execute(
                select(dead_letters.c.subject, dead_letters.c.reason)
                .where(dead_letters.c.source == "dispatch")
                .order_by(dead_letters.c.id)
            )
        ).all()
    subject = f"{settings.dispatch_topic}@0:"
    reasons = {r.subject: r.reason for r in rows}
    assert sorted(reasons) == [subject + str(offset) for offset in range(4)]
    assert reasons[subject + "0"].startswith("invalid_envelope: Invalid JSON")
    assert reasons[subject + "1"].startswith("invalid_envelope: v:")
    assert reasons[subject + "2"] == f"unknown_job: no job {unknown}"
    assert reasons[subject + "3"].startswith("invalid_envelope:")
    read = await read_until(
        settings.require_kafka(), settings.dead_letter_topic, lambda found: len(found) >= 4
    )
    records = {r.subject: r for r in map(DeadRecord.model_validate_json, (m.value for m in read))}
    assert {k: r.reason for k, r in records.items()} == reasons
    assert records[subject + "3"].size > HUGE
    assert len(records[subject + "3"].payload) == 65_536  # kept, cut short
    assert (await states(db, [job_id]))[job_id] == ("succeeded", 1)
