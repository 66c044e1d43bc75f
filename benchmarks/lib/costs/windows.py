"""The costs benchmark's windows, one after another on one stack: counters before, the load,
the drain until every job has ended and the outbox is published, the settle, counters
after (each process's CPU, PostgreSQL's, the topics' records and bytes)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from aiokafka import TopicPartition

from benchmarks.lib.costs.observer import (
    TOP_N,
    TOP_N_IDLE,
    Flat,
    Observer,
    ended_states,
    pg_mark,
    pg_window,
    top_statements,
)
from benchmarks.lib.costs.options import Options
from benchmarks.lib.offer import Batches, Load, offer, offer_batches, offer_plain
from benchmarks.lib.processes import Stack, api_ready, warm_up
from benchmarks.lib.receivers import Receiver
from benchmarks.lib.sampling import process_cpu_s, tree_cpu_s
from benchmarks.lib.stack import TERMINAL, alter_system, make_broker
from benchmarks.lib.topics import read_topics, watermark_growth
from benchmarks.lib.trace import Mix, backlog
from plumbing.settings import Settings
from schemas import constants
from sluicegate.local.broker.apache import ApacheKafka
from sluicegate.local.broker.tansu import TansuBroker
from sluicegate.local.embedded import EmbeddedPostgres


@dataclass(frozen=True)
class Pids:
    roles: dict[str, int]
    postmaster: int
    broker: int
    observer_backend: int


def cpu_now(pids: Pids) -> Flat:
    """CPU seconds so far of each process (PostgreSQL less this benchmark's backend)."""
    out = {f"cpu_ms.{role}": tree_cpu_s(pid) * 1000 for role, pid in pids.roles.items()}
    observer = process_cpu_s(pids.observer_backend) * 1000
    out["cpu_ms.postgres"] = tree_cpu_s(pids.postmaster) * 1000 - observer
    out["cpu_ms.broker"] = tree_cpu_s(pids.broker) * 1000
    out["cpu_ms.observer_backend"] = observer
    out["cpu_ms.load_generator"] = time.process_time() * 1000
    return out


@dataclass
class Servers:
    admin_url: str
    bootstrap: str
    postgres_dir: Path
    broker: ApacheKafka | TansuBroker

    def postmaster_pid(self) -> int:
        return int((self.postgres_dir / "postmaster.pid").read_text().split()[0])


async def preload_statements(pg: EmbeddedPostgres) -> None:
    """``pg_stat_statements`` loaded at start."""
    await alter_system(pg, "shared_preload_libraries", "'pg_stat_statements'")


@asynccontextmanager
async def servers(
    directory: Path, max_connections: int | None = None
) -> AsyncIterator[Servers]:
    """Embedded PostgreSQL (with pg_stat_statements; ``max_connections`` if given) and
    broker: the benchmarks that read their processes start their own, so they do not take
    SLUICEGATE_BENCH_DATABASE_URL / SLUICEGATE_BENCH_KAFKA."""
    pg = EmbeddedPostgres(directory / "pg")
    broker = make_broker(directory)
    try:
        await asyncio.to_thread(pg.start)
        if max_connections is not None:
            await alter_system(pg, "max_connections", str(max_connections))
        await preload_statements(pg)
        await broker.start()
        yield Servers(pg.admin_url, broker.bootstrap, pg.data_dir, broker)
    finally:
        broker.stop()
        await asyncio.to_thread(pg.stop)


@dataclass
class Run:
    """What the windows share: the stack, the connections and the topics' positions."""

    settings: Settings
    stack: Stack
    servers: Servers
    obs: Observer
    receiver: Receiver
    topics: dict[str, tuple[str, int]]
    positions: dict[TopicPartition, int] = field(default_factory=dict)
    args: Options = field(default_factory=Options)

    def pids(self) -> Pids:
        return Pids(
            roles={role: p.pid for role, p in self.stack.processes.items()},
            postmaster=self.servers.postmaster_pid(),
            broker=self.servers.broker.pid or 0,
            observer_backend=self.obs.backend_pid,
        )

    def client(self, tenant: str) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{self.settings.api_port}",
            headers={constants.HEADER_TENANT: tenant},
            limits=httpx.Limits(max_connections=256),
            timeout=60.0,
        )


@dataclass
class Offered:
    """What a window's load got: the jobs accepted (ids, where single) and the answers."""

    jobs: int = 0
    ids: set[str] = field(default_factory=set)
    answers: dict[str, int] = field(default_factory=dict)
    batches: int = 0
    callbacks: bool = False


async def drain(run: Run, tenant: str, offered: Offered) -> float:
    """Until every accepted job has ended (and reached the receiver, with callbacks) and
    the outbox is published, or ``--drain-s``; the seconds it took."""
    started = time.monotonic()
    terminal = sorted(TERMINAL)
    while time.monotonic() - started < run.args.drain_s:
        run.stack.check()
        ended = await run.obs.fetchval(
            "SELECT count(*) FROM jobs WHERE tenant = $1 AND state = ANY($2::text[])",
            tenant,
            terminal,
        )
        delivered = not offered.callbacks or offered.ids <= set(run.receiver.ids_by_job)
        if ended >= offered.jobs and delivered:
            unpublished = await run.obs.fetchval(
                "SELECT count(*) FROM outbox WHERE published_at IS NULL"
            )
            if unpublished == 0:
                break
        await asyncio.sleep(1.0)
    return time.monotonic() - started


async def window(
    run: Run, name: str, tenant: str, load: Callable[[], Awaitable[Offered]]
) -> dict[str, Any]:
    """One measured window: counters before, the load, the drain, the settle, counters after."""
    print(f"window {name} ...", flush=True)
    quiet_s = 1.0 if run.args.quick else 2.0
    reading = await read_topics(run.servers.bootstrap, run.topics, run.positions, quiet_s)
    await run.obs.fetchval("SELECT pg_stat_statements_reset()")
    pg_start = await pg_mark(run.obs)
    pids = run.pids()
    cpu_start, t0 = cpu_now(pids), time.monotonic()
    offered = await load()
    load_s = time.monotonic() - t0
    drain_s = await drain(run, tenant, offered) if offered.jobs else 0.0
    await asyncio.sleep(run.args.settle_s)
    cpu_end, t1 = cpu_now(pids), time.monotonic()
    pg, statements = await pg_window(run.obs, pg_start)
    ended = await ended_states(run.obs, tenant)
    after = await read_topics(run.servers.bootstrap, run.topics, reading.positions, quiet_s)
    run.positions = after.positions
    names = {label: name for label, (name, _) in run.topics.items()}
    raw: Flat = {k: cpu_end[k] - cpu_start[k] for k in cpu_start}
    raw |= pg | after.counters
    jobs = offered.jobs
    return {
        "tenant": tenant,
        "window_s": round(t1 - t0, 2),
        "load_s": round(load_s, 2),
        "drain_s": round(drain_s, 2),
        "jobs_accepted": jobs,
        "jobs_ended": sum(ended.values()),
        "ended_states": ended,
        "answers": offered.answers,
        "batches_accepted": offered.batches,
        "callbacks": offered.callbacks,
        "accepted_jobs_per_s": round(jobs / load_s, 3) if load_s else None,
        "raw": {k: round(v, 3) for k, v in raw.items()},
        "kafka_watermark_records": watermark_growth(reading.watermarks, after.watermarks, names),
        "top_statements_by_calls": top_statements(
            statements, max(jobs, 1), "calls", TOP_N_IDLE if name == "idle" else TOP_N
        ),
        "top_statements_by_time": top_statements(statements, max(jobs, 1), "total_exec_time"),
    }


def idle_load(seconds: float) -> Callable[[], Awaitable[Offered]]:
    async def load() -> Offered:
        await asyncio.sleep(seconds)
        return Offered()

    return load


def single_load(run: Run, tenant: str, callback: str | None) -> Callable[[], Awaitable[Offered]]:
    async def load() -> Offered:
        got = Load()
        async with run.client(tenant) as client:
            if callback is None:
                await offer_plain(client, got, run.args.rate, run.args.load_s)
            else:
                await offer(client, got, run.args.rate, run.args.load_s, callback)
        answers = Counter(str(a.status) for a in got.answers)
        ids = set(got.accepted)
        return Offered(len(ids), ids, dict(answers), callbacks=callback is not None)

    return load


def batch_load(run: Run, tenant: str) -> Callable[[], Awaitable[Offered]]:
    async def load() -> Offered:
        got, size = Batches(), run.args.batch_size
        docs = backlog(400, Mix(), seed=13)
        async with run.client(tenant) as client:
            await offer_batches(
                client,
                got,
                lambda k: docs[k % len(docs)],
                every_s=size / run.args.rate,  # a batch of size lines every size / rate s
                size=size,
                seconds=run.args.load_s,
            )
        answers = {"201": len(got.accepted), **got.refused}
        return Offered(sum(got.accepted.values()), answers=answers, batches=len(got.accepted))

    return load


async def windows_of(run: Run) -> dict[str, dict[str, Any]]:
    args = run.args
    callback = f"http://127.0.0.1:{run.receiver.port}/hook"
    out = {"idle": await window(run, "idle", "costs-idle", idle_load(args.idle_s))}
    out["single"] = await window(run, "single", "costs-a", single_load(run, "costs-a", None))
    out["single_callback"] = await window(
        run, "single_callback", "costs-b", single_load(run, "costs-b", callback)
    )
    if args.batch_size > 0:
        out["batch"] = await window(run, "batch", "costs-c", batch_load(run, "costs-c"))
    return out


async def prepare(run: Run) -> None:
    """The processes up, a webhook secret for every tenant, the worker warmed up."""
    run.stack.start()
    async with run.client("costs-a") as client:
        await api_ready(client, run.stack)
        for tenant in ("costs-a", "costs-b", "costs-c"):
            r = await client.post("/v1/webhooks/secrets", headers={constants.HEADER_TENANT: tenant})
            r.raise_for_status()
        await warm_up(client, run.settings.speed_min_samples)
    await asyncio.sleep(run.args.settle_s)
