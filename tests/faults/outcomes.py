"""What a fault left behind, counted: each job's final state, its terminal events, the
dispatch records the outbox wrote for it (a second one is the reconciler's or a fresh log's
re-dispatch) and those the broker's log holds (more than the outbox wrote is a relay that
sent a round again)."""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass
from typing import Any

import httpx
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from plumbing.settings import Settings
from schemas.envelopes import JobEvent
from schemas.states import TERMINAL_STATES
from schemas.tables import jobs, outbox
from tests.support.topics import log_records

TERMINAL = {s.value for s in TERMINAL_STATES}


async def submit(api: httpx.AsyncClient, count: int, **body: Any) -> list[str]:
    """``count`` jobs, each accepted; a refusal while the lag cannot be read (a broker
    outage) is retried after its Retry-After, as a client would."""
    ids: list[str] = []
    async with asyncio.timeout(60):
        while len(ids) < count:
            r = await api.post("/v1/jobs", json={"kind": "complete", **body})
            if r.status_code == 503 and r.json().get("reason") == "broker_unavailable":
                await asyncio.sleep(r.json()["retry_after_ms"] / 1000)
                continue
            assert r.status_code == 202, r.text
            ids.append(r.json()["id"])
    return ids


async def states(db: AsyncEngine, ids: list[str]) -> dict[str, tuple[str, int]]:
    async with db.connect() as conn:
        rows = await conn.execute(
            select(jobs.c.id, jobs.c.state, jobs.c.attempt).where(jobs.c.id.in_(ids))
        )
        return {str(r.id): (r.state, r.attempt) for r in rows}


async def until(db: AsyncEngine, ids: list[str], done: Any, within_s: float) -> None:
    """Until ``done(states)`` holds; else fails with the jobs' states as last seen."""
    found: dict[str, tuple[str, int]] = {}
    try:
        async with asyncio.timeout(within_s):
            while not done(found := await states(db, ids)):
                await asyncio.sleep(0.2)
    except TimeoutError:
        seen = Counter(f"{state} (attempt {attempt})" for state, attempt in found.values())
        raise AssertionError(f"not done within {within_s} s; the jobs were: {seen}") from None


def running(found: dict[str, tuple[str, int]]) -> int:
    return sum(state == "running" for state, _ in found.values())


def all_ended(found: dict[str, tuple[str, int]]) -> bool:
    return all(state in TERMINAL for state, _ in found.values())


@dataclass(frozen=True, kw_only=True)
class Outcome:
    final: Counter[str]  # jobs by final state
    taken_over: int  # jobs that ran again under a newer attempt
    terminal_events: Counter[str]  # by job
    dispatch_rows: Counter[str]  # by job: what the outbox wrote
    dispatch_records: Counter[str]  # by job: what the broker's log holds

    def redispatched(self) -> int:
        """Jobs given a second dispatch record by the reconciler (or a new log)."""
        return sum(n - 1 for n in self.dispatch_rows.values())

    def resent(self) -> int:
        """Records the relay published again (a round it saw no acknowledgement for)."""
        return sum(self.dispatch_records.values()) - sum(self.dispatch_rows.values())

    def summary(self) -> str:
        return (
            f"final {dict(self.final)}, taken over {self.taken_over}, "
            f"re-dispatched by the reconciler {self.redispatched()}, "
            f"records sent again by the relay {self.resent()}"
        )


async def outcome(settings: Settings, db: AsyncEngine, ids: list[str]) -> Outcome:
    found = await states(db, ids)
    async with db.connect() as conn:
        rows = (await conn.execute(select(outbox.c.topic, outbox.c.key, outbox.c.payload))).all()
    ends = Counter(r.key for r in rows if r.key in found and terminal_event(r.payload))
    return Outcome(
        final=Counter(state for state, _ in found.values()),
        taken_over=sum(attempt >= 2 for _, attempt in found.values()),
        terminal_events=ends,
        dispatch_rows=Counter(r.key for r in rows if r.topic == settings.dispatch_topic),
        dispatch_records=(
            await log_records(
                settings.require_kafka(), settings.dispatch_topic, settings.partitions
            )
        )[1],
    )


def exactly_once(result: Outcome, ids: list[str]) -> None:
    """Nothing lost, nothing doubled: every job succeeded, with one terminal event."""
    assert result.final == Counter({"succeeded": len(ids)}), result.summary()
    assert result.terminal_events == Counter(dict.fromkeys(ids, 1)), result.summary()


def terminal_event(payload: bytes, terminal: set[str] = TERMINAL) -> bool:
    try:
        event = JobEvent.model_validate_json(payload)
    except ValueError:
        return False  # a dispatch record
    return event.state.value in terminal


DOC = "A worker that dies mid-decode leaves its offsets uncommitted. " * 8
