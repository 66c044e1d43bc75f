"""A document too long for its engine becomes a graph of jobs inside the pipeline, on the
real database and broker: one job to the caller, its chunks in parallel, reduces in levels,
one result with the graph's usage, one event; a cancel reaches every job of it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import datetime

import pytest
from sqlalchemy import func, select

from plumbing.db import make_engine
from plumbing.settings import Settings
from producers.service import run_relay
from schemas.envelopes import JobEvent
from schemas.tables import graphs, jobs, outbox
from tests.integration.pipeline import Pipeline, open_pipeline
from tests.support.long_text import long_document
from workers.engines.sim.tokens import count_tokens
from workers.service import run_worker

CONTEXT = 512  # the simulated model's max_model_len: a document of ~3,000 tokens is cut
MAX_TOKENS = 40


@pytest.fixture
async def pipeline(settings: Settings) -> AsyncIterator[Pipeline]:
    small = settings.model_copy(update={"sim_time_scale": 0.05, "sim_max_model_len": CONTEXT})
    async for p in open_pipeline(small):
        yield p


async def rows(settings: Settings, query):  # type: ignore[no-untyped-def]
    db = make_engine(settings.require_database_url(), pool_size=1)
    try:
        async with db.connect() as conn:
            return (await conn.execute(query)).mappings().all()
    finally:
        await db.dispose()


async def submit(pipeline: Pipeline, text: str, **extra: object) -> str:
    body = {"kind": "summarize", "input": text, "max_tokens": MAX_TOKENS, **extra}
    r = await pipeline.client.post("/v1/jobs", json=body)
    assert r.status_code == 202, r.text
    return str(r.json()["id"])


async def test_a_long_document_is_one_job_summarized_through_its_graph(
    pipeline: Pipeline,
) -> None:
    pipeline.start(run_relay)
    pipeline.start(run_worker)
    pipeline.start(run_worker)
    text = long_document(2500)
    assert count_tokens(text) > 3 * CONTEXT
    short = await submit(pipeline, "A short note. It fits the context whole.")
    doc = await submit(pipeline, text)
    views = await pipeline.wait_terminal([doc, short], timeout_s=90)
    view = views[doc]
    assert view["state"] == "succeeded", view
    assert views[short]["state"] == "succeeded"
    assert views[short]["graph"] is None
    s = pipeline.settings
    children = await rows(
        s, select(jobs).where(jobs.c.parent_id == doc).order_by(jobs.c.level, jobs.c.seq)
    )
    chunks = [c for c in children if c["level"] == 0]
    levels = {c["level"] for c in children}
    assert len(chunks) >= 6
    assert len(levels) >= 2
    assert {c["state"] for c in children} == {"succeeded"}
    assert all(c["attempt"] == 1 for c in children)
    # Every part fits the context with its output, and the chunks cover the document.
    for child in children:
        assert count_tokens(child["input"]) + MAX_TOKENS <= CONTEXT
    assert "Section 1:" in chunks[0]["input"]
    last_words = text.split()[-5:]
    assert " ".join(last_words) in chunks[-1]["input"]
    # Each level's deadline keeps back the time of the levels after it; the last one's is
    # the document's.
    deadline = datetime.fromisoformat(view["deadline"])
    by_level = {level: {c["deadline"] for c in children if c["level"] == level} for level in levels}
    assert all(len(d) == 1 for d in by_level.values())
    ordered = [by_level[level].pop() for level in sorted(levels)]
    assert ordered == sorted(ordered)
    assert ordered[0] < deadline
    assert ordered[-1] == deadline
    # The document's one result: the last reduce's summary, with the whole graph's usage.
    top = max(levels)
    final = [c for c in children if c["level"] == top]
    assert len(final) == 1
    result = view["result"]
    assert result["text"] == final[0]["result"]["text"]
    assert result["prompt_tokens"] == sum(c["result"]["prompt_tokens"] for c in children)
    assert result["output_tokens"] == sum(c["result"]["output_tokens"] for c in children)
    assert result["graph"] == {"chunks": len(chunks), "levels": top + 1}
    assert view["graph"]["chunks"] == len(chunks)
    assert view["graph"]["ended"] == view["graph"]["total"] == 1
    timeline = (await pipeline.client.get(f"/v1/jobs/{doc}/timeline")).json()
    assert timeline["graph"]["chunks"] == len(chunks)
    assert timeline["finish_reason"] in ("stop", "length")
    part = (await pipeline.client.get(f"/v1/jobs/{chunks[0]['id']}/timeline")).json()
    assert part["parent_id"] == doc
    # One terminal event for the document, none for its parts.
    events = await rows(s, select(outbox.c.payload).where(outbox.c.topic == s.events_topic))
    announced = [JobEvent.model_validate_json(r["payload"]).job_id for r in events]
    assert announced.count(doc) == 1
    assert not {c["id"] for c in children} & set(announced)
    # Its page shows the document's first lines, its graph by level, and its summary.
    # (auth = tenant_header: the page's login takes the tenant's name)
    login = {"key": view["tenant"], "next": "/ui/jobs"}
    logged = await pipeline.client.post("/ui/login", data=login)
    assert logged.status_code == 303, logged.text
    page = await pipeline.client.get(f"/ui/jobs/{doc}")
    assert page.status_code == 200, page.text
    assert "Section 1:" in page.text
    assert f"Cut into {len(chunks)} chunks" in page.text
    assert f'href="/ui/jobs/{chunks[-1]["id"]}"' in page.text
    assert 'id="summary"' in page.text
    part = await pipeline.client.get(f"/ui/jobs/{chunks[0]['id']}")
    assert f'href="/ui/jobs/{doc}"' in part.text
    assert 'id="cancel-job"' not in part.text
    # A part is not the caller's to cancel: its document is.
    refused = await pipeline.client.delete(f"/v1/jobs/{chunks[0]['id']}")
    assert refused.status_code == 409
    assert refused.json()["error"]["code"] == "job_terminal"


async def test_cancelling_a_document_ends_every_job_of_it(pipeline: Pipeline) -> None:
    # Slow, two at a time: some of its jobs run while others wait for the worker.
    slow = pipeline.settings.model_copy(update={"sim_time_scale": 2.0, "worker_max_running": 2})
    pipeline.settings = slow
    pipeline.start(run_relay)
    pipeline.start(run_worker)
    doc = await submit(pipeline, long_document(6000, seed=11))
    s = pipeline.settings
    async with asyncio.timeout(60):  # until some of its chunks run
        while not await rows(
            s, select(jobs.c.id).where(jobs.c.parent_id == doc, jobs.c.state == "running")
        ):
            await asyncio.sleep(0.2)
    queued = await rows(
        s,
        select(jobs.c.id).where(
            jobs.c.parent_id == doc, jobs.c.state.in_(["queued", "dispatched"])
        ),
    )
    assert queued, "every chunk started at once: nothing left to drop before decode"
    part = (await rows(s, select(jobs.c.id).where(jobs.c.parent_id == doc).limit(1)))[0]["id"]
    refused = await pipeline.client.delete(f"/v1/jobs/{part}")
    assert refused.status_code == 409
    assert refused.json()["error"]["code"] == "job_of_document"
    r = await pipeline.client.delete(f"/v1/jobs/{doc}")
    assert r.status_code == 200, r.text
    cancelled_at = datetime.fromisoformat(r.json()["finished_at"])
    assert r.json()["state"] == "cancelled"
    states = await rows(
        s, select(jobs.c.state, func.count()).where(jobs.c.parent_id == doc).group_by(jobs.c.state)
    )
    assert {row["state"] for row in states} <= {"succeeded", "cancelled"}
    # The running ones are aborted, the others never start; none ends after the cancel.
    await asyncio.sleep(3)
    late = await rows(
        s,
        select(jobs.c.id).where(
            jobs.c.parent_id == doc,
            jobs.c.state == "succeeded",
            jobs.c.finished_at > cancelled_at,
        ),
    )
    assert not late
    never = await rows(
        s,
        select(jobs.c.id).where(
            jobs.c.id.in_([q["id"] for q in queued]), jobs.c.started_at.is_not(None)
        ),
    )
    assert not never, "a part cancelled before it started was started after all"
    graph = await rows(s, select(graphs).where(graphs.c.job_id == doc))
    assert graph[0]["level"] == 0


async def test_a_document_whose_caller_stops_polling_is_abandoned_with_its_parts(
    pipeline: Pipeline,
) -> None:
    slow = pipeline.settings.model_copy(
        update={"sim_time_scale": 2.0, "worker_max_running": 2, "control_sweep_s": 0.5}
    )
    pipeline.settings = slow
    pipeline.start(run_relay)
    pipeline.start(run_worker)
    doc = await submit(pipeline, long_document(6000, seed=5), abandon_after_s=3)
    s = pipeline.settings
    async with asyncio.timeout(60):  # its parts run; the caller polls no more
        while not await rows(
            s, select(jobs.c.id).where(jobs.c.parent_id == doc, jobs.c.state == "running")
        ):
            await asyncio.sleep(0.2)
    async with asyncio.timeout(30):  # the lease lapses: the sweep abandons it whole
        while (await rows(s, select(jobs.c.state).where(jobs.c.id == doc)))[0]["state"] != (
            "abandoned"
        ):
            await asyncio.sleep(0.3)
    await asyncio.sleep(2)
    left = await rows(
        s,
        select(jobs.c.state, func.count()).where(jobs.c.parent_id == doc).group_by(jobs.c.state),
    )
    assert {row["state"] for row in left} <= {"succeeded", "abandoned"}, left
    events = await rows(s, select(outbox.c.payload).where(outbox.c.topic == s.events_topic))
    announced = [JobEvent.model_validate_json(r["payload"]).job_id for r in events]
    assert announced.count(doc) == 1
