"""Set a record aside that a consumer cannot handle (not JSON, a wrong schema version, an
unknown job): a ``dead_letters`` row with the reason, and a DeadRecord on the dead-letter
topic through the outbox, in one transaction. The consumer then moves past it."""

from __future__ import annotations

from sqlalchemy import insert
from sqlalchemy.ext.asyncio import AsyncConnection

from schemas.envelopes import MAX_DEAD_PAYLOAD, DeadRecord
from schemas.tables import dead_letters, outbox


def record_subject(topic: str, partition: int, offset: int) -> str:
    return f"{topic}@{partition}:{offset}"


async def set_aside(
    conn: AsyncConnection,
    *,
    dead_letter_topic: str,
    source: str,
    subject: str,
    reason: str,
    payload: bytes,
) -> None:
    # As text PostgreSQL takes: undecodable bytes and NULs become U+FFFD.
    text = payload[:MAX_DEAD_PAYLOAD].decode("utf-8", errors="replace").replace("\x00", "\ufffd")
    record = DeadRecord(
        source=source, subject=subject, reason=reason, size=len(payload), payload=text
    )
    await conn.execute(
        insert(dead_letters).values(source=source, subject=subject, reason=reason, payload=text)
    )
    await conn.execute(insert(outbox).values(record.outbox_row(dead_letter_topic, subject)))
