"""Helpers for the drop and abort tests: an engine that records what reached it, and direct
reads of job rows (a GET through the API would renew a heartbeat lease)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import asyncpg

from benchmarks.lib.engine import Counting
from plumbing.db import libpq_url
from plumbing.settings import Settings
from schemas.states import JobState
from workers.engines.sim.engine import SimEngine

# 600 sentences: about 10k prompt tokens, and a summary that runs to ~2,000 output tokens.
LONG_DOC = " ".join(
    f"Sentence number {i} talks about topic {i % 7} and gives detail {i * 3}." for i in range(600)
)
SHORT_DOC = "A short note about queues. It says that bounded queues keep latency bounded."


class SpyEngine(Counting):
    """The benchmark's counting engine, also telling what the engine had decoded in all
    when the worker aborted a job."""

    def __init__(self, engine: SimEngine) -> None:
        super().__init__(engine)
        self.aborted: dict[str, int] = {}  # job id -> engine tokens_decoded when aborted

    async def abort(self, request_id: str) -> None:
        self.aborted.setdefault(request_id.split(":")[0], self.engine.tokens_decoded)
        await super().abort(request_id)


async def job_row(settings: Settings, job_id: str) -> dict[str, Any]:
    conn = await asyncpg.connect(libpq_url(settings.require_database_url()))
    try:
        row = await conn.fetchrow("SELECT * FROM jobs WHERE id = $1", job_id)
    finally:
        await conn.close()
    assert row is not None
    out = dict(row)
    if isinstance(out["error"], str):
        out["error"] = json.loads(out["error"])
    return out


async def wait_row(
    settings: Settings, job_id: str, *, decoded: bool = False, timeout_s: float = 30
) -> dict[str, Any]:
    """The job's row once it is terminal (and, if asked, its decoded tokens are written)."""
    async with asyncio.timeout(timeout_s):
        while True:
            row = await job_row(settings, job_id)
            if JobState(row["state"]).terminal and (
                not decoded or row["decoded_tokens"] is not None
            ):
                return row
            await asyncio.sleep(0.05)


async def terminal_events(settings: Settings, job_id: str) -> list[str]:
    """The terminal states the job's outbox events announce (one, if all is well)."""
    conn = await asyncpg.connect(libpq_url(settings.require_database_url()))
    try:
        rows = await conn.fetch(
            "SELECT payload FROM outbox WHERE topic = $1 AND key = $2 ORDER BY id",
            settings.events_topic,
            job_id,
        )
    finally:
        await conn.close()
    return [json.loads(r["payload"])["state"] for r in rows]
