"""Jobs nobody waits for never reach the engine; jobs that stop being wanted while they
decode are aborted within a step. Real PostgreSQL, real broker, the simulator behind a spy."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import httpx
import pytest

from plumbing.db import make_engine
from plumbing.metrics import registry
from plumbing.settings import Settings
from producers.api.app import create_app
from producers.jobs.repository import JobRepository
from producers.service import run_relay
from schemas.errors import JobAlreadyTerminal
from schemas.states import JobState
from tests.integration.drops import (
    LONG_DOC,
    SHORT_DOC,
    SpyEngine,
    job_row,
    terminal_events,
    wait_row,
)
from tests.integration.pipeline import Pipeline, open_pipeline
from tests.integration.serving import post_then_hang_up, serving
from workers.consumer import Worker
from workers.engines.base import Finished, Generation, GenerationRequest
from workers.engines.sim.engine import SimEngine
from workers.gate import Candidate, Drop
from workers.repository import WorkerRepository
from workers.service import run_worker, working

# About 40 ms per decode step (a NOTIFY takes about a millisecond), and 1.6 s to prefill
# LONG_DOC.
SLOW = 5.0


@pytest.fixture
def drop_settings(settings: Settings) -> Settings:
    # The API's deadline-aware admission would refuse the short deadlines used here: these
    # tests are about what the worker does with jobs that were accepted.
    return settings.model_copy(update={"deadline_aware": False, "control_sweep_s": 0.2})


@pytest.fixture
async def pipeline(drop_settings: Settings) -> AsyncIterator[Pipeline]:
    async for p in open_pipeline(drop_settings):
        p.start(run_relay)
        yield p


def start_worker(pipeline: Pipeline, spy: SpyEngine) -> list[Worker]:
    workers: list[Worker] = []

    async def role(settings: Settings, stop: asyncio.Event) -> None:
        async with working(settings, stop, engine=spy) as worker:
            if worker is not None:
                workers.append(worker)
                await worker.run(stop)

    pipeline.start(role)
    return workers


async def submit(pipeline: Pipeline, **body: Any) -> str:
    r = await pipeline.client.post(
        "/v1/jobs", json={"kind": "summarize", "input": SHORT_DOC, **body}
    )
    assert r.status_code == 202, r.text
    return str(r.json()["id"])


def dropped(reason: str) -> float:
    worker = registry("worker")
    value = worker.get_sample_value("sluicegate_worker_jobs_dropped_total", {"reason": reason})
    return value or 0.0


async def wait_dropped(reason: str, above: float) -> None:
    async with asyncio.timeout(30):
        while dropped(reason) <= above:
            await asyncio.sleep(0.05)


def assert_dropped_before_decode(row: dict[str, Any], state: str, reason: str) -> None:
    assert row["state"] == state
    assert row["error"]["reason"] == reason
    assert row["error"]["stage"] == "before_decode"
    assert row["decoded_tokens"] == 0


async def test_passed_deadline_never_reaches_the_engine(
    pipeline: Pipeline, drop_settings: Settings
) -> None:
    late = await submit(pipeline, ttl_s=0.3)
    on_time = await submit(pipeline)
    await asyncio.sleep(0.6)  # the first deadline passes while the record waits in Kafka
    spy = SpyEngine(SimEngine(time_scale=0.0))
    start_worker(pipeline, spy)
    row = await wait_row(drop_settings, late)
    assert_dropped_before_decode(row, "expired", "deadline_passed")
    assert (await wait_row(drop_settings, on_time))["state"] == "succeeded"
    assert late not in spy.received
    assert on_time in spy.received
    assert await terminal_events(drop_settings, late) == ["expired"]


async def test_unreachable_deadline_never_reaches_the_engine(
    pipeline: Pipeline, drop_settings: Settings
) -> None:
    spy = SpyEngine(SimEngine(time_scale=SLOW))
    start_worker(pipeline, spy)
    warmup = [await submit(pipeline, max_tokens=32) for _ in range(drop_settings.speed_min_samples)]
    for job_id in warmup:  # the worker measures the engine's speed on these
        assert (await wait_row(drop_settings, job_id))["state"] == "succeeded"
    # ~2,000 output tokens at ~40 ms a step take over a minute: a 5 s deadline cannot hold.
    hopeless = await submit(pipeline, input=LONG_DOC, max_tokens=2000, ttl_s=5)
    feasible = await submit(pipeline, max_tokens=32, ttl_s=5)
    row = await wait_row(drop_settings, hopeless)
    assert_dropped_before_decode(row, "expired", "deadline_unreachable")
    assert (await wait_row(drop_settings, feasible))["state"] == "succeeded"
    assert hopeless not in spy.received
    assert feasible in spy.received


async def test_cancel_before_start_never_reaches_the_engine(pipeline: Pipeline) -> None:
    job = await submit(pipeline)
    r = await pipeline.client.delete(f"/v1/jobs/{job}")
    assert r.status_code == 200
    assert r.json()["state"] == "cancelled"
    before = dropped("cancelled")
    spy = SpyEngine(SimEngine(time_scale=0.0))
    start_worker(pipeline, spy)
    await wait_dropped("cancelled", before)  # the worker read the record and let it go
    assert job not in spy.received
    assert await terminal_events(pipeline.settings, job) == ["cancelled"]


async def test_lapsed_heartbeat_never_reaches_the_engine(
    pipeline: Pipeline, drop_settings: Settings
) -> None:
    job = await submit(pipeline, abandon_after_s=1)
    await asyncio.sleep(1.5)  # nobody polls it
    spy = SpyEngine(SimEngine(time_scale=0.0))
    start_worker(pipeline, spy)
    row = await wait_row(drop_settings, job)
    assert_dropped_before_decode(row, "abandoned", "heartbeat_lapsed")
    assert job not in spy.received


async def joined(pipeline: Pipeline) -> None:
    """Once a first job succeeded, the worker has joined the group (seconds on Tansu)."""
    job = await submit(pipeline, max_tokens=8)
    assert (await wait_row(pipeline.settings, job))["state"] == "succeeded"


async def decoding(pipeline: Pipeline, **body: Any) -> tuple[SpyEngine, str]:
    """A worker on a slow simulator, and a long job of its own decoding there."""
    spy = SpyEngine(SimEngine(time_scale=SLOW))
    start_worker(pipeline, spy)
    await joined(pipeline)
    job = await submit(pipeline, input=LONG_DOC, max_tokens=2000, **body)
    async with asyncio.timeout(30):
        while spy.tokens[job] < 3:
            await asyncio.sleep(0.01)
    return spy, job


async def stopped(settings: Settings, job_id: str) -> dict[str, Any]:
    """The job's row once its decoded tokens are written, read a few steps' time before
    returning (so that any decoding after the abort would show)."""
    row = await wait_row(settings, job_id, decoded=True)
    await asyncio.sleep(0.2)
    return row


def assert_stopped_within_a_step(spy: SpyEngine, row: dict[str, Any], job_id: str) -> None:
    assert job_id in spy.aborted  # the worker told the engine to stop
    # Only this job ran: every token the engine decoded after the abort would be its own.
    assert spy.engine.tokens_decoded - spy.aborted[job_id] <= 1
    cap = spy.engine.capacity()
    assert cap.running == 0
    assert cap.free_blocks == cap.total_blocks  # its blocks are free
    assert row["error"]["stage"] == "decode"
    assert 0 < row["decoded_tokens"] < 2000
    assert row["decoded_tokens"] == spy.tokens[job_id]


async def test_cancel_while_running_aborts_within_a_step(
    pipeline: Pipeline, drop_settings: Settings
) -> None:
    spy, job = await decoding(pipeline)
    r = await pipeline.client.delete(f"/v1/jobs/{job}")
    assert r.status_code == 200
    at_cancel = spy.engine.tokens_decoded
    row = await stopped(drop_settings, job)
    assert row["state"] == "cancelled"
    assert_stopped_within_a_step(spy, row, job)
    # Learned from the NOTIFY, not from the 0.2 s sweep (5 steps away).
    assert spy.aborted[job] - at_cancel <= 2
    assert await terminal_events(drop_settings, job) == ["cancelled"]


async def test_lapsed_heartbeat_while_running_aborts_within_a_step(
    pipeline: Pipeline, drop_settings: Settings
) -> None:
    spy, job = await decoding(pipeline, abandon_after_s=3.5)
    row = await stopped(drop_settings, job)
    assert row["state"] == "abandoned"
    assert row["error"]["reason"] == "heartbeat_lapsed"
    assert_stopped_within_a_step(spy, row, job)
    assert await terminal_events(drop_settings, job) == ["abandoned"]


async def test_deadline_crossed_while_running_aborts_within_a_step(
    pipeline: Pipeline, drop_settings: Settings
) -> None:
    spy, job = await decoding(pipeline, ttl_s=4)
    row = await stopped(drop_settings, job)
    assert row["state"] == "expired"
    assert row["error"]["reason"] == "deadline_passed"
    assert row["finished_at"] >= row["deadline"]
    assert_stopped_within_a_step(spy, row, job)
    assert await terminal_events(drop_settings, job) == ["expired"]


class Stalling(SpyEngine):
    """Holds a finished stream back ``stall_s`` seconds, blocking the event loop: the last
    token comes after a deadline whose timer has had no chance to fire."""

    stall_s = 0.0

    def generate(self, request: GenerationRequest) -> Generation:
        return Generation(self._stalled(request))

    async def _stalled(self, request: GenerationRequest) -> AsyncGenerator[str | Finished, None]:
        items = [item async for item in super().generate(request).items()]
        time.sleep(self.stall_s)  # noqa: ASYNC251 - blocking is the point
        for item in items:
            yield item


async def test_a_result_complete_after_the_deadline_is_expired_not_succeeded(
    pipeline: Pipeline, drop_settings: Settings
) -> None:
    spy = Stalling(SimEngine(time_scale=0.0))
    start_worker(pipeline, spy)
    await joined(pipeline)
    spy.stall_s = 2.5
    job = await submit(pipeline, max_tokens=8, ttl_s=2)
    row = await wait_row(drop_settings, job, decoded=True)
    assert row["state"] == "expired"
    assert row["error"] == {
        "code": "deadline_passed",
        "reason": "deadline_passed",
        "stage": "decode",
        "message": row["error"]["message"],
    }
    assert row["finished_at"] > row["deadline"]
    assert row["decoded_tokens"] == spy.tokens[job] > 0
    assert await terminal_events(drop_settings, job) == ["expired"]


async def test_disconnect_while_waiting_aborts_within_a_step(drop_settings: Settings) -> None:
    """A caller holding POST ?wait= with abandon_on_disconnect hangs up mid-decode (a real
    server and a real socket): the job is abandoned and the engine stops within a step."""
    app = create_app(drop_settings)
    stop = asyncio.Event()
    spy = SpyEngine(SimEngine(time_scale=SLOW))
    tasks = [
        asyncio.create_task(run_relay(drop_settings, stop)),
        asyncio.create_task(run_worker(drop_settings, stop, engine=spy)),
    ]
    try:
        async with serving(app) as port:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                r = await client.post(
                    "/v1/jobs", json={"kind": "summarize", "input": SHORT_DOC, "max_tokens": 8}
                )
            first = r.json()["id"]
            assert (await wait_row(drop_settings, first))["state"] == "succeeded"  # joined

            def decoding() -> bool:
                return any(spy.tokens[j] >= 3 for j in spy.received if j != first)

            body = {
                "kind": "summarize",
                "input": LONG_DOC,
                "max_tokens": 2000,
                "abandon_on_disconnect": True,
            }
            await post_then_hang_up(port, body, decoding, within_s=30)
            [job] = [j for j in spy.received if j != first]
            row = await stopped(drop_settings, job)
        assert row["state"] == "abandoned"
        assert row["error"]["reason"] == "disconnected"
        assert_stopped_within_a_step(spy, row, job)
        assert await terminal_events(drop_settings, job) == ["abandoned"]
    finally:
        stop.set()
        await asyncio.gather(*tasks)


@pytest.mark.parametrize("gate_says", ["run", "drop"])
async def test_cancel_while_the_gate_decides_leaves_one_terminal_state(
    pipeline: Pipeline, drop_settings: Settings, gate_says: str
) -> None:
    """The cancel arrives while the pre-decode gate holds the row: it waits, then finds the
    job running (it cancels it) or dropped (409); never two terminal states."""
    job = await submit(pipeline)
    db = make_engine(drop_settings.require_database_url(), pool_size=2)
    producers = JobRepository(
        db, dispatch_topic=drop_settings.dispatch_topic, events_topic=drop_settings.events_topic
    )
    workers = WorkerRepository(db, events_topic=drop_settings.events_topic)
    cancels: list[asyncio.Task[Any]] = []

    def judge(candidate: Candidate) -> Drop | None:
        cancels.append(asyncio.create_task(producers.cancel("default", candidate.job_id)))
        if gate_says == "run":
            return None
        return Drop(state=JobState.EXPIRED, reason="deadline_passed")

    try:
        outcome = await workers.claim_batch([job], judge, len)
        [cancel] = cancels
        if gate_says == "run":
            assert outcome[job] is not None
            assert not isinstance(outcome[job], Drop)
            cancelled = await cancel
            assert cancelled.state is JobState.CANCELLED
            assert await terminal_events(drop_settings, job) == ["cancelled"]
        else:
            assert isinstance(outcome[job], Drop)
            with pytest.raises(JobAlreadyTerminal):
                await cancel
            assert await terminal_events(drop_settings, job) == ["expired"]
        assert JobState((await job_row(drop_settings, job))["state"]).terminal
    finally:
        await db.dispose()


async def test_cancels_racing_the_worker_leave_one_terminal_state_each(
    pipeline: Pipeline, drop_settings: Settings
) -> None:
    spy = SpyEngine(SimEngine(time_scale=1.0))
    workers = start_worker(pipeline, spy)
    jobs = [await submit(pipeline, max_tokens=64) for _ in range(40)]
    for i, job in enumerate(jobs):  # cancels land before, during and after the claims
        await asyncio.sleep(0.01 * (i % 5))
        if i % 2 == 0:
            r = await pipeline.client.delete(f"/v1/jobs/{job}")
            assert r.status_code in (200, 409)
    for job in jobs:
        await wait_row(drop_settings, job)
    async with asyncio.timeout(30):
        while workers[0].running:  # aborted jobs write their decoded tokens last
            await asyncio.sleep(0.05)
    rows = [await job_row(drop_settings, job) for job in jobs]
    for job, row in zip(jobs, rows, strict=True):
        assert await terminal_events(drop_settings, job) == [row["state"]]
        if row["state"] == "cancelled" and job not in spy.received:
            assert row["decoded_tokens"] in (None, 0)
