"""A batch far over lag_hard, metered in: a 20,000-line file batch with lag_hard at 500 is
accepted at once, the lag stays under lag_hard while it runs, single submits are admitted
beside it, and every line ends exactly once. The relay and a worker run as processes, the
API in this process (its lag reading is the one admission uses)."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from plumbing.settings import Settings
from producers.batches.meter_repository import BACKLOG_STATES
from schemas.constants import M_LAG
from schemas.tables import jobs, outbox
from tests.faults.outcomes import terminal_event, until
from tests.faults.processes import roles
from tests.integration.serving import serve

pytestmark = pytest.mark.timeout(600)

LINES = 20_000
LAG_HARD = 500
TENANT = {"X-Sluicegate-Tenant": "acme"}


def line(i: int) -> bytes:
    body = {"model": "sim", "prompt": f"Summarize document {i}.", "max_tokens": 2}
    return json.dumps(
        {"custom_id": f"doc-{i}", "method": "POST", "url": "/v1/completions", "body": body}
    ).encode()


class Watch:
    """The highest lag seen: the API's own reading (what admission acts on) and
    PostgreSQL's backlog of released and single jobs not ended, sampled every 100 ms."""

    def __init__(self) -> None:
        self.api_lag = 0
        self.backlog = 0
        self.samples = 0

    async def run(self, api: httpx.AsyncClient, db: AsyncEngine, stop: asyncio.Event) -> None:
        while not stop.is_set():
            for row in (await api.get("/metrics")).text.splitlines():
                if row.startswith((f"{M_LAG} ", f"{M_LAG}{{")):  # one pool, labelled
                    self.api_lag = max(self.api_lag, int(float(row.split()[1])))
            async with db.connect() as conn:
                backlog = await conn.scalar(
                    select(func.count()).where(~jobs.c.held, jobs.c.state.in_(BACKLOG_STATES))
                )
            self.backlog = max(self.backlog, int(backlog or 0))
            self.samples += 1
            await asyncio.sleep(0.1)


async def singles(api: httpx.AsyncClient, stop: asyncio.Event) -> list[httpx.Response]:
    """A single submit every 0.5 s while the batch runs."""
    answers = []
    while not stop.is_set():
        body = {"kind": "complete", "input": "A single document.", "max_tokens": 2}
        answers.append(await api.post("/v1/jobs", json=body, headers=TENANT))
        await asyncio.sleep(0.5)
    return answers


async def test_a_20000_line_batch_is_metered_in_under_lag_hard(
    settings: Settings, db: AsyncEngine, tmp_path: Path
) -> None:
    own = settings.model_copy(update={"lag_soft": 400, "lag_hard": LAG_HARD, "sim_time_scale": 0.0})
    data = b"\n".join(line(i) for i in range(LINES)) + b"\n"
    with roles(own, tmp_path) as started:
        started.start("relay")
        started.start("worker")
        async with serve(own, db) as api:
            upload = await api.post(
                "/v1/files",
                files={"file": ("docs.jsonl", data)},
                data={"purpose": "batch"},
                headers=TENANT,
            )
            assert upload.status_code == 201, upload.text
            began = time.monotonic()
            made = await api.post(
                "/v1/batches",
                json={"input_file_id": upload.json()["id"], "endpoint": "/v1/completions"},
                headers=TENANT,
            )
            accepted_s = time.monotonic() - began
            assert made.status_code == 201, made.text
            batch = made.json()
            assert batch["request_counts"]["total"] == LINES

            stop = asyncio.Event()
            watch = Watch()
            watching = asyncio.create_task(watch.run(api, db, stop))
            submitting = asyncio.create_task(singles(api, stop))
            async with asyncio.timeout(480):
                while batch["status"] in ("validating", "in_progress", "finalizing"):
                    await asyncio.sleep(1.0)
                    batch = (await api.get(f"/v1/batches/{batch['id']}", headers=TENANT)).json()
            ran_s = time.monotonic() - began
            stop.set()
            await watching
            answers = await submitting
            assert answers
            refused = [r.text for r in answers if r.status_code != 202]
            assert {r.status_code for r in answers} == {202}, refused
            ids = [r.json()["id"] for r in answers]
            await until(db, ids, lambda s: set(s.values()) == {("succeeded", 1)}, 60)
            output = await api.get(f"/v1/files/{batch['output_file_id']}/content", headers=TENANT)
        print(
            f"\n{LINES:,} lines: accepted in {accepted_s:.1f} s, ended in {ran_s:.0f} s "
            f"({LINES / ran_s:.0f} jobs/s); highest lag {watch.api_lag} (API reading), "
            f"{watch.backlog} (PostgreSQL backlog) over {watch.samples} samples; "
            f"{len(answers)} single submits"
        )

    assert batch["status"] == "completed", batch
    assert batch["request_counts"] == {"total": LINES, "completed": LINES, "failed": 0}
    assert 0 < watch.api_lag <= LAG_HARD
    assert 0 < watch.backlog <= LAG_HARD
    async with db.connect() as conn:
        ended = dict((await conn.execute(select(jobs.c.id, jobs.c.state))).all())
        records = (await conn.execute(select(outbox.c.topic, outbox.c.key, outbox.c.payload))).all()
    custom_ids = Counter(json.loads(row)["custom_id"] for row in output.text.splitlines())
    assert custom_ids == Counter({f"doc-{i}": 1 for i in range(LINES)})
    terminal = {"succeeded", "failed", "expired", "cancelled", "abandoned"}
    ends = Counter(r.key for r in records if terminal_event(r.payload, terminal))
    assert len(ended) == LINES + len(ids)
    assert ends == Counter(dict.fromkeys(map(str, ended), 1))  # one terminal event per job
    dispatches = Counter(r.key for r in records if r.topic == own.dispatch_topic)
    assert dispatches == Counter(dict.fromkeys(map(str, ended), 1))  # released once each
