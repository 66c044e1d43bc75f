"""Sluicegate's ingress, measured from outside: ``sluicegate api`` (uvicorn) and ``sluicegate
relay`` as subprocesses on a run's own database, loaded over loopback HTTP by aiohttp
clients in a closed loop (each sends its next request when the last one is answered); the
answers' latencies, the API process's CPU, and the relay's drain of the outbox after."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.lib.ingress_clients import (
    drive_blocking_client,
    drive_client,
    drive_wrk,
    wrk_found,
)
from benchmarks.lib.ingress_runs import JOB, Run, Served, bench_modules
from benchmarks.lib.stack import bench_settings, services
from plumbing.settings import Settings
from schemas.constants import M_SUBMIT_GROUP as SUBMIT_GROUP
from sluicegate.local.embedded import free_port

ROOT = Path(__file__).resolve().parents[2]
TENANT = {"X-Sluicegate-Tenant": "bench", "Content-Type": "application/json"}
OUT_OF_REACH = 1_000_000_000
DRAIN_TIMEOUT_S = 300.0


def env_of(settings: Settings) -> dict[str, str]:
    """The environment that makes ``Settings()`` in a subprocess equal ``settings``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICEGATE_")}
    for name, value in settings.model_dump(mode="json", include=settings.model_fields_set).items():
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, list | dict):
            text = json.dumps(value)
        else:
            text = str(value)
        env[f"SLUICEGATE_{name.upper()}"] = text
    return env


@asynccontextmanager
async def served(settings: Settings, processes: int) -> AsyncIterator[Served]:
    """``sluicegate api`` and ``sluicegate relay`` as subprocesses."""
    aiohttp = bench_modules()[2]
    port = free_port()
    env = env_of(settings)
    command = [sys.executable, "-m", "sluicegate"]
    started = []
    try:
        for sub in (["api", "--port", str(port), "--workers", str(processes)], ["relay"]):
            started.append(await asyncio.create_subprocess_exec(*command, *sub, env=env, cwd=ROOT))
        url = f"http://127.0.0.1:{port}"
        async with aiohttp.ClientSession() as session, asyncio.timeout(60):
            while True:
                with contextlib.suppress(aiohttp.ClientError):
                    async with session.get(f"{url}/healthz") as r:
                        if r.status == 200:
                            break
                if started[0].returncode is not None:
                    raise RuntimeError(f"sluicegate api exited with {started[0].returncode}")
                await asyncio.sleep(0.2)
        yield Served(url=url, api_pid=started[0].pid)
    finally:
        for process in started:
            process.send_signal(signal.SIGTERM)
        for process in started:
            try:
                await asyncio.wait_for(process.wait(), 15)
            except TimeoutError:
                process.kill()
                await process.wait()


async def drive(
    api: Served, path: str, body: bytes, *, clients: int, seconds: float, jobs: int
) -> Run:
    """``clients`` aiohttp clients posting ``body`` in a closed loop for ``seconds``."""
    aiohttp = bench_modules()[2]
    run = Run(jobs_per_request=jobs)
    cpu, client_cpu = api.api_cpu_s(), time.process_time()
    connector = aiohttp.TCPConnector(limit=clients)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(api.url, connector=connector, timeout=timeout) as session:
        groups = await group_commits(session)
        loop = asyncio.get_running_loop()
        until = loop.time() + seconds

        async def client() -> None:
            while (started := loop.time()) < until:
                async with session.post(path, data=body, headers=TENANT) as r:
                    await r.read()
                    run.statuses[r.status] += 1
                    if r.status < 300:
                        run.latencies.append(loop.time() - started)

        began = loop.time()
        await asyncio.gather(*(client() for _ in range(clients)))
        run.elapsed_s = loop.time() - began
        jobs_after, statements_after = await group_commits(session)
        run.groups = (jobs_after - groups[0], statements_after - groups[1])
    run.cpu_s = api.api_cpu_s() - cpu
    run.client_cpu_s = time.process_time() - client_cpu
    return run


async def group_commits(session: Any) -> tuple[float, float]:
    """Single submits written so far, and the statements that wrote them (the group-size
    histogram of the API's /metrics; with several API processes, of the one that answers)."""
    async with session.get("/metrics") as r:
        text = await r.text()
    found = {"_sum": 0.0, "_count": 0.0}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        for suffix in found:
            if name == f"{SUBMIT_GROUP}{suffix}":
                found[suffix] = float(value)
    return found["_sum"], found["_count"]


def batch_body(size: int) -> bytes:
    """A batch of ``size`` copies of JOB (the batch's completion window replaces ttl_s)."""
    line = {k: v for k, v in JOB.items() if k != "ttl_s"}
    lines = [
        {"custom_id": f"r{i}", "method": "POST", "url": "/v1/jobs", "body": line}
        for i in range(size)
    ]
    return json.dumps({"requests": lines, "completion_window": "1h"}).encode()


async def database_facts(settings: Settings) -> dict[str, Any]:
    import asyncpg

    from plumbing.db import libpq_url

    conn = await asyncpg.connect(libpq_url(settings.require_database_url()))
    try:
        version = await conn.fetchval("SHOW server_version")
        fsync = await conn.fetchval("SHOW fsync")
        sync = await conn.fetchval("SHOW synchronous_commit")
    finally:
        await conn.close()
    return {"postgres": version, "fsync": fsync, "synchronous_commit": sync}


async def outbox_drained(settings: Settings, timeout_s: float) -> dict[str, Any]:
    """Wait for the relay to publish every outbox row; how long it took, and the counts."""
    import asyncpg

    from plumbing.db import libpq_url

    conn = await asyncpg.connect(libpq_url(settings.require_database_url()))
    try:
        began = time.perf_counter()
        unpublished = "SELECT count(*) FROM outbox WHERE published_at IS NULL"
        # No event tells of the last publish: poll.
        left = await conn.fetchval(unpublished)
        while left and time.perf_counter() - began < timeout_s:
            await asyncio.sleep(0.2)
            left = await conn.fetchval(unpublished)
        jobs = await conn.fetchval("SELECT count(*) FROM jobs")
        published = await conn.fetchval(
            "SELECT count(*) FROM outbox WHERE published_at IS NOT NULL"
        )
    finally:
        await conn.close()
    return {
        "jobs_stored": jobs,
        "outbox_published": published,
        "outbox_left": left,
        "drain_after_load_s": round(time.perf_counter() - began, 2),
    }


@dataclass(frozen=True, kw_only=True)
class SubmitLoad:
    """What ``sluicegate_runs`` offers (the ingress benchmark's arguments of these names)."""

    clients: int = 64  # concurrent single submitters
    seconds: float = 10.0  # each loaded run
    alone_seconds: float = 5.0  # the one-client run
    warmup: float = 2.0
    batch_size: int = 1000
    batch_clients: int = 4
    api_processes: tuple[int, ...] = (1, 2)  # sluicegate api --workers: all runs on the first
    wrk_connections: tuple[int, ...] = (1, 16, 64)


async def sluicegate_runs(load: SubmitLoad) -> dict[str, Any]:
    """Single submits from aiohttp clients (``clients`` and one alone), from the project's
    client and from wrk, then batches, through ``sluicegate api`` and ``sluicegate relay``
    as processes; the figures of each. Each further ``api_processes`` count runs the
    loaded single submits again (the project's client and wrk) on a new API."""

    overrides: dict[str, Any] = {"lag_soft": OUT_OF_REACH, "lag_hard": OUT_OF_REACH}
    figures: dict[str, Any] = {}
    async with (
        services() as (admin, bootstrap),
        bench_settings(admin, bootstrap, **overrides) as settings,
    ):
        for n, processes in enumerate(load.api_processes):
            on = f"{processes}_api_process{'es' if processes > 1 else ''}"
            async with served(settings, processes) as api:
                single = json.dumps(JOB).encode()
                await drive(
                    api, "/v1/jobs", single, clients=load.clients, seconds=load.warmup, jobs=1
                )
                # One caller first, on a quiet stack: not behind the loaded runs' leftovers.
                runs = {**await _alone(api, load), **await _runs(api, load)} if n == 0 else {}
                runs[f"client_{load.clients}_tasks"] = await drive_client(
                    api, tasks=load.clients, seconds=load.seconds
                )
                figures[on] = {name: run.figures() for name, run in runs.items()}
                for connections in load.wrk_connections if wrk_found() else ():
                    if n == 0 or connections == max(load.wrk_connections):
                        wrk = await asyncio.to_thread(
                            drive_wrk, api, connections=connections, seconds=load.seconds
                        )
                        figures[on][f"wrk_{connections}_connections"] = wrk
        drained = await outbox_drained(settings, DRAIN_TIMEOUT_S)
        facts = await database_facts(settings)
    where = "embedded" if "SLUICEGATE_BENCH_DATABASE_URL" not in os.environ else "local server"
    return {
        "setup": f"`sluicegate api --workers N` (uvicorn) and `sluicegate relay` in "
        f"subprocesses, {where} PostgreSQL {facts['postgres']} (fsync {facts['fsync']}, "
        f"synchronous_commit {facts['synchronous_commit']}); loads over loopback HTTP in a "
        "closed loop: aiohttp clients, the project's client (its concurrent submits "
        "coalesced into POST /v1/jobs/bulk), wrk; cpu_ms_per_job: of the API process(es)",
        **figures,
        "wrk": "wrk not found (apt install wrk): its runs are left out"
        if not wrk_found()
        else "wrk 4, at most 2 threads",
        "relay": drained,
    }


async def _alone(api: Served, load: SubmitLoad) -> dict[str, Run]:
    """One caller in a closed loop: aiohttp, the project's client (one task, over the submit
    channel), and a plain loop of its blocking client."""
    single = json.dumps(JOB).encode()
    return {
        "single_1_client": await drive(
            api, "/v1/jobs", single, clients=1, seconds=load.alone_seconds, jobs=1
        ),
        "client_1_task": await drive_client(api, tasks=1, seconds=load.alone_seconds),
        "blocking_client_loop": await asyncio.to_thread(
            drive_blocking_client, api, seconds=load.alone_seconds
        ),
    }


async def _runs(api: Served, load: SubmitLoad) -> dict[str, Run]:
    """The aiohttp loads: single submits from ``clients``, then batches."""
    single, batch = json.dumps(JOB).encode(), batch_body(load.batch_size)
    await drive(api, "/v1/batches", batch, clients=1, seconds=load.warmup, jobs=1)
    return {
        f"single_{load.clients}_clients": await drive(
            api, "/v1/jobs", single, clients=load.clients, seconds=load.seconds, jobs=1
        ),
        f"batches_of_{load.batch_size}_{load.batch_clients}_clients": await drive(
            api,
            "/v1/batches",
            batch,
            clients=load.batch_clients,
            seconds=load.seconds,
            jobs=load.batch_size,
        ),
    }
