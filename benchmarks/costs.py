"""Costs: what one accepted job costs each process, PostgreSQL and the broker, measured.

``python -m sluicegate api``, ``relay``, ``worker`` (the simulator at ``--time-scale`` x
its roofline time) and ``webhooks`` run as separate processes, as in the soak
(``benchmarks/soak.py``, whose processes, load and readiness helpers this reuses), on
embedded PostgreSQL started with ``shared_preload_libraries = 'pg_stat_statements'`` (set
with ``ALTER SYSTEM`` and a restart, in this run's own data directory: ``sluicegate up`` is
untouched) and the embedded broker. The load is steady and well below capacity: Poisson
single submits at ``--rate`` jobs/s (the 2-core machine with the whole stack on it is the
tighter limit: the retention benchmark sustained about 6 jobs/s). After the worker's
warm-up, the run measures these windows, one after another on the same stack:

- ``idle``: ``--idle-s`` seconds of no load, the stack's own background cost per second
  (polling, heartbeats, the relay's pruner, consumer commits);
- ``single``: single submits for ``--load-s`` seconds, without a callback;
- ``single_callback``: the same submits (the soak's ``offer``, same seeds), each with a
  callback to a receiver in this process that answers 204: ``single_callback`` minus
  ``single`` is the marginal cost of one webhook delivery;
- ``batch``: the same rate of jobs arriving as OpenAI-style batches of ``--batch-size``
  lines (``POST /v1/batches`` with ``requests``, no callback): the batch path's per-job cost.

A window starts just before the first submit and ends once every job accepted in it has
ended (and, with callbacks, reached the receiver), no outbox row is unpublished, and
``--settle-s`` more seconds have passed (PostgreSQL's statistics are flushed by each backend
at most once a second, and up to 10 s late when it goes idle). At both ends:

- CPU seconds of each process from ``/proc/<pid>/stat``: utime + stime + cutime + cstime
  (``SC_CLK_TCK`` ticks) of the process and every live descendant, so that a child reaped
  in the window still counts (in its parent's cutime). PostgreSQL is the postmaster's
  tree (every backend, the checkpointer, the WAL writer, autovacuum), less the backend of
  this benchmark's own connection; the broker is its process (the JVM of Apache Kafka,
  or Tansu with SLUICEGATE_BENCH_BROKER=tansu; all its threads).
- PostgreSQL: ``pg_stat_statements`` (reset at the start; the calls of the stack's role
  in the run's database, the benchmark's own connection being another role), transactions
  (``pg_stat_database.xact_commit`` of the run's database, less this benchmark's own
  statements), WAL (``pg_current_wal_lsn()`` difference, and ``pg_stat_wal`` records and
  full-page images: server-wide), rows written (``n_tup_ins + n_tup_upd + n_tup_del`` of
  ``pg_stat_user_tables``, by table).
- Kafka: every record of the dispatch, events and dead-letter topics from the true end at
  the start to the end after the settle, read with aiokafka until nothing more comes for
  2 s (Tansu's high watermark can trail the last batch, so the watermark difference is
  reported beside it): records, and bytes as ``len(key) + len(value) + headers`` (the
  payload; the broker's record-batch framing is not counted).

Per job is the window's figure divided by the jobs accepted in it (all of which ended in
it); ``per_job_net_of_idle`` first takes away the idle rate x the window's length, which
is the better figure for a marginal cost (the gross one spreads the background over the
jobs, more so at lower rates: cost(rate) ~ idle_per_s + rate x net per job).

Caveats: the worker runs the simulator engine, which sleeps its decode steps, so the
worker's CPU is Sluicegate's own per-job work (consume, claim, heartbeat, stream, write
the end), not an inference engine's; a GPU engine's process would add its own. The load
generator and the webhook receiver run in this process (their CPU is reported apart, not
counted). ``pg_stat_statements`` itself adds a little to PostgreSQL's CPU per statement.
WAL and checkpoint figures are server-wide and include full-page images after a
checkpoint (``wal_fpi``), which depends on when one falls. The rows are the statistics
collector's, which trail by up to the settle. Consumer-group offset commits go to the
broker and are not records of these topics. Retention windows are set long so nothing is
pruned in the run; afterwards, the average bytes per row of each table
(``pg_total_relation_size / count(*)``, indexes and TOAST included) size a database at a
retention window.

Writes docs/bench/costs.json and costs.png. Not part of ``python -m benchmarks`` unless
registered there.

    flock /tmp/bench.lock python -m benchmarks.costs [--rate 4.5] [--load-s 75] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import platform
import random
import re
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from ipaddress import ip_network
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import psutil
from aiokafka import AIOKafkaConsumer, TopicPartition

from benchmarks.costs_plot import plot_costs
from benchmarks.harness import (
    OUT_DIR,
    TERMINAL,
    alter_system,
    bench_settings,
    columns,
    make_broker,
    write_report,
)
from benchmarks.naive import capacity
from benchmarks.soak import (
    ROLES,
    Batches,
    Load,
    Receiver,
    Stack,
    api_ready,
    offer,
    offer_batches,
    submit,
    warm_up,
)
from benchmarks.trace import Mix, backlog
from plumbing.db import libpq_url
from plumbing.settings import Settings
from schemas import constants
from sluicegate.local.broker.apache import ApacheKafka
from sluicegate.local.broker.tansu import TansuBroker
from sluicegate.local.embedded import EmbeddedPostgres, free_port

OUT = OUT_DIR / "costs.json"
OBSERVER = "costs_observer"  # the role of this benchmark's own connection
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PROCESSES = (*ROLES, "postgres", "broker")
TABLES = ("jobs", "outbox", "batches", "webhook_deliveries", "webhook_attempts", "dead_letters")
WIDTH_TABLES = ("jobs", "outbox", "batches", "webhook_deliveries", "webhook_attempts")
TOPICS = ("dispatch", "events", "dead_letter")
TRANSACTION_CONTROL = re.compile(r"^\s*(BEGIN|COMMIT|ROLLBACK|START|SAVEPOINT|RELEASE)\b", re.I)
TOP_N = 10

Flat = dict[str, float]  # a window's counters, by dotted name ("cpu_ms.api", "pg.statements")


# --- CPU from /proc -----------------------------------------------------------------------


def process_cpu_s(pid: int) -> float:
    """utime + stime + cutime + cstime of ``pid`` in seconds (0 once it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat.rsplit(")", 1)[1].split()  # fields from the third, state, on
    return sum(int(v) for v in fields[11:15]) / CLOCK_TICKS


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of ``pid`` and its live descendants, reaped ones included (cutime)."""
    try:
        children = [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        children = []
    return process_cpu_s(pid) + sum(process_cpu_s(c) for c in children)


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


# --- the servers --------------------------------------------------------------------------


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
async def servers(directory: Path) -> AsyncIterator[Servers]:
    """Embedded PostgreSQL (with pg_stat_statements) and broker: this benchmark reads their
    processes, so it does not take SLUICEGATE_BENCH_DATABASE_URL / SLUICEGATE_BENCH_KAFKA."""
    pg = EmbeddedPostgres(directory / "pg")
    broker = make_broker(directory)
    try:
        await asyncio.to_thread(pg.start)
        await preload_statements(pg)
        await broker.start()
        yield Servers(pg.admin_url, broker.bootstrap, pg.data_dir, broker)
    finally:
        broker.stop()
        await asyncio.to_thread(pg.stop)


# --- PostgreSQL ---------------------------------------------------------------------------


@dataclass
class Observer:
    """This benchmark's connection to the run's database, as its own role; it counts its
    statements (each a transaction of the database's, taken away from the stack's)."""

    conn: asyncpg.Connection
    backend_pid: int
    statements: int = 0

    async def fetch(self, sql: str, *args: Any) -> list[asyncpg.Record]:
        self.statements += 1
        return list(await self.conn.fetch(sql, *args))

    async def fetchval(self, sql: str, *args: Any) -> Any:
        self.statements += 1
        return await self.conn.fetchval(sql, *args)


async def observer(admin_url: str, database_url: str) -> Observer:
    admin = await asyncpg.connect(admin_url)
    try:
        exists = await admin.fetchval("SELECT 1 FROM pg_roles WHERE rolname = $1", OBSERVER)
        if not exists:
            await admin.execute(f"CREATE ROLE {OBSERVER} LOGIN SUPERUSER")
    finally:
        await admin.close()
    url = libpq_url(database_url).replace("://postgres@", f"://{OBSERVER}@", 1)
    conn = await asyncpg.connect(url)
    await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    return Observer(conn, int(await conn.fetchval("SELECT pg_backend_pid()")))


_DATABASE_SQL = """
SELECT xact_commit, xact_rollback, pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0') AS lsn,
       (SELECT wal_records FROM pg_stat_wal) AS wal_records,
       (SELECT wal_fpi FROM pg_stat_wal) AS wal_fpi,
       (SELECT wal_bytes FROM pg_stat_wal) AS wal_bytes,
       (SELECT num_timed + num_requested FROM pg_stat_checkpointer) AS checkpoints
FROM pg_stat_database WHERE datname = current_database()
"""

_TABLE_STATS_SQL = """
SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del
FROM pg_stat_user_tables WHERE schemaname = 'public'
"""

_STATEMENTS_SQL = """
SELECT s.query, s.calls, s.total_exec_time, s.rows, s.wal_bytes
FROM pg_stat_statements s
WHERE s.dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND s.userid <> (SELECT oid FROM pg_roles WHERE rolname = $1)
"""


async def pg_mark(obs: Observer) -> Flat:
    """The database's counters now (pg_stat_statements is read apart, at the end)."""
    row = (await obs.fetch(_DATABASE_SQL))[0]
    counters: Flat = {
        "pg.transactions": float(row["xact_commit"]),
        "pg.rollbacks": float(row["xact_rollback"]),
        "pg.wal_records": float(row["wal_records"]),
        "pg.wal_fpi": float(row["wal_fpi"]),
        "pg.wal_bytes_stat": float(row["wal_bytes"]),
        "pg.wal_bytes": float(row["lsn"]),  # pg_current_wal_lsn(), as bytes
        "observer_statements": float(obs.statements),
        "checkpoints": float(row["checkpoints"]),
    }
    for t in await obs.fetch(_TABLE_STATS_SQL):
        name = t["relname"]
        ops = {"ins": t["n_tup_ins"], "upd": t["n_tup_upd"], "del": t["n_tup_del"]}
        for op, value in ops.items():
            counters[f"pg.rows_by_table_op.{name}.{op}"] = float(value)
        counters[f"pg.rows_by_table_op.{name}.hot_upd"] = float(t["n_tup_hot_upd"])
        counters[f"pg.rows_by_table.{name}"] = float(sum(ops.values()))
    counters["pg.rows_written"] = sum(
        v for k, v in counters.items() if k.startswith("pg.rows_by_table.")
    )
    return counters


async def pg_window(obs: Observer, start: Flat) -> tuple[Flat, list[dict[str, Any]]]:
    """The counters' growth since ``start``, and the statements run since the reset."""
    end = await pg_mark(obs)
    out = {k: v - start.get(k, 0.0) for k, v in end.items()}
    # The observer's own statements are transactions of this database too.
    out["pg.transactions"] -= out.pop("observer_statements")
    statements = [dict(r) for r in await obs.fetch(_STATEMENTS_SQL, OBSERVER)]
    out["pg.statements"] = float(sum(s["calls"] for s in statements))
    out["pg.statements_excluding_transaction_control"] = float(
        sum(s["calls"] for s in statements if not TRANSACTION_CONTROL.match(s["query"]))
    )
    out["pg.statement_exec_ms"] = float(sum(s["total_exec_time"] for s in statements))
    return out, statements


def top_statements(statements: list[dict[str, Any]], jobs: int, key: str) -> list[dict[str, Any]]:
    """The ``TOP_N`` statements by ``key``, per job, their text shortened."""
    ranked = sorted(statements, key=lambda s: -float(s[key]))[:TOP_N]
    return [
        {
            "query": shorten(s["query"]),
            "calls_per_job": round(s["calls"] / jobs, 3),
            "exec_ms_per_job": round(s["total_exec_time"] / jobs, 4),
            "mean_ms": round(s["total_exec_time"] / s["calls"], 4) if s["calls"] else None,
            "rows_per_call": round(s["rows"] / s["calls"], 2) if s["calls"] else None,
            "wal_bytes_per_job": round(float(s["wal_bytes"]) / jobs, 1),
            "calls": int(s["calls"]),
        }
        for s in ranked
    ]


def shorten(query: str, width: int = 160) -> str:
    text = " ".join(query.split())
    return text if len(text) <= width else text[: width - 3] + "..."


_WIDTH_SQL = """
SELECT pg_total_relation_size(c.oid) AS total, pg_relation_size(c.oid) AS heap,
       pg_indexes_size(c.oid) AS indexes,
       COALESCE(pg_total_relation_size(NULLIF(c.reltoastrelid, 0)), 0) AS toast
FROM pg_class c WHERE c.oid = $1::regclass
"""


async def row_widths(obs: Observer) -> dict[str, dict[str, Any]]:
    """Bytes per row of each table now (indexes, TOAST and free space included)."""
    out: dict[str, dict[str, Any]] = {}
    for name in WIDTH_TABLES:
        rows = int(await obs.fetchval(f'SELECT count(*) FROM "{name}"'))
        sizes = (await obs.fetch(_WIDTH_SQL, name))[0]
        entry: dict[str, Any] = {"rows": rows, **{k: int(v) for k, v in sizes.items()}}
        entry["bytes_per_row"] = round(sizes["total"] / rows, 1) if rows else None
        entry["heap_bytes_per_row"] = round(sizes["heap"] / rows, 1) if rows else None
        out[name] = entry
    return out


# --- Kafka --------------------------------------------------------------------------------


@dataclass
class Reading:
    positions: dict[TopicPartition, int]  # the next offset after the last record read
    watermarks: dict[TopicPartition, int]
    counters: Flat


async def read_topics(
    bootstrap: str,
    topics: dict[str, tuple[str, int]],
    start: dict[TopicPartition, int],
    quiet_s: float = 2.0,
) -> Reading:
    """Every record from ``start`` (0 where not given) until nothing more comes for
    ``quiet_s``: records and payload bytes by topic (``topics``: label -> (name,
    partitions))."""
    label_of = {name: label for label, (name, _) in topics.items()}
    tps = [TopicPartition(name, p) for name, count in topics.values() for p in range(count)]
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    counters: Flat = {f"kafka.{k}.{t}": 0.0 for k in ("records", "bytes") for t in topics}
    positions = {tp: start.get(tp, 0) for tp in tps}
    try:
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, positions[tp])
        watermarks = await consumer.end_offsets(tps)
        quiet_since = time.monotonic()
        while time.monotonic() - quiet_since < quiet_s:
            batch = await consumer.getmany(timeout_ms=300)
            behind = [tp for tp in tps if await consumer.position(tp) < watermarks[tp]]
            if batch or behind:
                quiet_since = time.monotonic()
            for tp, records in batch.items():
                label = label_of[tp.topic]
                for record in records:
                    counters[f"kafka.records.{label}"] += 1
                    counters[f"kafka.bytes.{label}"] += record_bytes(record)
                    positions[tp] = record.offset + 1
    finally:
        await consumer.stop()
    return Reading(positions, dict(watermarks), counters)


def record_bytes(record: Any) -> int:
    headers = sum(len(k.encode()) + len(v or b"") for k, v in record.headers or ())
    return len(record.key or b"") + len(record.value or b"") + headers


def watermark_growth(
    before: dict[TopicPartition, int], after: dict[TopicPartition, int], topics: dict[str, str]
) -> dict[str, int]:
    return {
        label: sum(after[tp] - before.get(tp, 0) for tp in after if tp.topic == name)
        for label, name in topics.items()
    }


# --- the load -----------------------------------------------------------------------------


async def offer_plain(client: httpx.AsyncClient, load: Load, rate: float, seconds: float) -> None:
    """The soak's ``offer`` (same arrivals and documents) without a callback."""
    rng = random.Random(11)
    docs = backlog(400, Mix(), seed=13)
    tasks: set[asyncio.Task[None]] = set()
    started = time.monotonic()
    at, index = rng.expovariate(rate), 0
    while at < seconds:
        await asyncio.sleep(max(0.0, started + at - time.monotonic()))
        doc, max_tokens = docs[index % len(docs)]
        body = {"kind": "summarize", "input": doc, "max_tokens": max_tokens, "ttl_s": 3600}
        task = asyncio.create_task(submit(client, load, body, started))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        index += 1
        at += rng.expovariate(rate)
    await asyncio.gather(*tasks)


# --- the windows --------------------------------------------------------------------------


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
    args: argparse.Namespace = field(default_factory=argparse.Namespace)

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
        "top_statements_by_calls": top_statements(statements, max(jobs, 1), "calls"),
        "top_statements_by_time": top_statements(statements, max(jobs, 1), "total_exec_time"),
    }


async def ended_states(obs: Observer, tenant: str) -> dict[str, int]:
    rows = await obs.fetch(
        "SELECT state::text AS state, count(*) AS n FROM jobs WHERE tenant = $1 GROUP BY 1",
        tenant,
    )
    return {r["state"]: int(r["n"]) for r in rows if r["state"] in TERMINAL}


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


# --- the figures --------------------------------------------------------------------------


def per_job(raw: Flat, jobs: int, idle: Flat | None = None, seconds: float = 0.0) -> Flat:
    """Each counter per job; less ``idle`` (per second) x ``seconds`` first, when given."""
    if jobs <= 0:
        return {}
    base = idle or {}
    return {k: (v - base.get(k, 0.0) * seconds) / jobs for k, v in raw.items()}


def nest(flat: Flat, digits: int = 3) -> dict[str, Any]:
    """Dotted names as nested dicts: {"cpu_ms.api": 1} -> {"cpu_ms": {"api": 1}}."""
    out: dict[str, Any] = {}
    for key, value in sorted(flat.items()):
        *path, last = key.split(".")
        node = out
        for part in path:
            node = node.setdefault(part, {})
        node[last] = round(value, digits)
    return out


def keep(flat: Flat) -> Flat:
    """The counters of the per-job figures (not the benchmark's own, not checkpoints)."""
    own = ("cpu_ms.observer_backend", "cpu_ms.load_generator", "checkpoints")
    return {k: v for k, v in flat.items() if k not in own}


def delivery_cost(with_cb: Flat, without: Flat) -> dict[str, Any]:
    """The callback's marginal cost: a window with callbacks less one without, per job."""
    diff = {k: with_cb.get(k, 0.0) - without.get(k, 0.0) for k in with_cb.keys() | without}
    return {
        "cpu_ms_webhooks": round(diff.get("cpu_ms.webhooks", 0.0), 3),
        "cpu_ms_all": round(sum(v for k, v in diff.items() if k.startswith("cpu_ms.")), 3),
        "pg_statements": round(diff.get("pg.statements", 0.0), 3),
        "pg_transactions": round(diff.get("pg.transactions", 0.0), 3),
        "wal_bytes": round(diff.get("pg.wal_bytes", 0.0), 1),
        "rows_written": round(diff.get("pg.rows_written", 0.0), 3),
        "detail": nest(diff),
    }


def figures(windows: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per job by window (gross, and net of the idle rate), the idle rates, and the
    webhook delivery's marginal cost."""
    idle = windows["idle"]
    idle_rate = {k: v / idle["window_s"] for k, v in keep(idle["raw"]).items()}
    gross, net = {}, {}
    for name, w in windows.items():
        if name == "idle" or not w["jobs_accepted"]:
            continue
        raw = keep(w["raw"])
        gross[name] = per_job(raw, w["jobs_accepted"])
        net[name] = per_job(raw, w["jobs_accepted"], idle_rate, w["window_s"])
    out: dict[str, Any] = {
        "idle_per_s": nest(idle_rate, 4),
        "per_job_by_window": {k: nest(v) for k, v in gross.items()},
        "per_job_net_of_idle_by_window": {k: nest(v) for k, v in net.items()},
        "per_ended_job_cpu_ms": {
            name: {
                k.split(".", 1)[1]: round(v / w["jobs_ended"], 3)
                for k, v in keep(w["raw"]).items()
                if k.startswith("cpu_ms.") and w["jobs_ended"]
            }
            for name, w in windows.items()
            if name != "idle"
        },
    }
    if "single" in gross:
        out["per_job"] = nest(gross["single"])
        out["per_job_net_of_idle"] = nest(net["single"])
    if "single" in gross and "single_callback" in gross:
        out["per_job"]["webhook_delivery"] = delivery_cost(
            gross["single_callback"], gross["single"]
        )
        out["per_job_net_of_idle"]["webhook_delivery"] = delivery_cost(
            net["single_callback"], net["single"]
        )
    if "batch" in gross:
        out["per_job"]["batch_path"] = nest(gross["batch"])
        out["per_job_net_of_idle"]["batch_path"] = nest(net["batch"])
    return out


def notes(windows: dict[str, dict[str, Any]]) -> list[str]:
    """What a reader of the figures should know about this run's windows."""
    out = []
    for name, w in windows.items():
        raw = w["raw"]
        if raw.get("checkpoints", 0) > 0:
            out.append(
                f"{name}: a checkpoint fell in the window; its WAL includes "
                f"{raw['pg.wal_fpi']:.0f} full-page images"
            )
        if w["jobs_ended"] < w["jobs_accepted"]:
            out.append(f"{name}: {w['jobs_accepted'] - w['jobs_ended']} jobs did not end")
        deleted = sum(
            v for k, v in raw.items() if k.startswith("pg.rows_by_table_op.") and k.endswith(".del")
        )
        if deleted:
            out.append(f"{name}: {deleted:.0f} rows were deleted (pruned) in the window")
    return out


# --- the run ------------------------------------------------------------------------------


def overrides(args: argparse.Namespace, token_s: float | None) -> dict[str, object]:
    out: dict[str, object] = {
        "api_port": free_port(),
        "partitions": 4,
        "lag_soft": 500,  # far above the jobs in flight at this load: nothing is refused
        "lag_hard": 600,
        "max_block_ms": 1000,
        "deadline_aware": False,
        "max_input_bytes": 1_000_000,
        "sim_time_scale": args.time_scale,
        "webhook_allow_networks": (ip_network("127.0.0.0/8"),),
        "webhook_retry_schedule_s": (0.0, 1.0, 5.0),
        # Long windows: nothing is pruned in the run (the pruner still runs its queries).
        "retention_outbox_s": 7 * 86_400.0,
        "retention_ended_s": 7 * 86_400.0,
    }
    if token_s is not None:
        out["expected_token_time_s"] = token_s
    return out


async def measure_capacity(args: argparse.Namespace) -> tuple[float | None, float | None]:
    """(jobs/s, decode s per token) of the simulator alone, or (None, None) when skipped."""
    if args.capacity_measure_s <= 0:
        return None, None
    print(f"measuring the engine's capacity (time scale {args.time_scale}) ...", flush=True)
    cap = await capacity(
        Mix(),
        time_scale=args.time_scale,
        warm_s=args.capacity_warm_s,
        measure_s=args.capacity_measure_s,
    )
    return cap.jobs_per_s, cap.decode_s_per_token


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


async def postgres_info(obs: Observer) -> dict[str, str]:
    rows = await obs.fetch(
        "SELECT name, setting FROM pg_settings WHERE name IN ('server_version', "
        "'shared_preload_libraries', 'shared_buffers', 'checkpoint_timeout', 'max_wal_size', "
        "'synchronous_commit', 'wal_level', 'full_page_writes', 'pg_stat_statements.track', "
        "'pg_stat_statements.track_utility')"
    )
    return {r["name"]: r["setting"] for r in rows}


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    started = time.monotonic()
    jobs_per_s, token_s = await measure_capacity(args)
    settings_over = overrides(args, token_s)
    receiver = Receiver()
    server = await receiver.serve()
    with tempfile.TemporaryDirectory(prefix="sluicegate-costs-") as tmp:
        async with (
            servers(Path(tmp)) as srv,
            bench_settings(
                srv.admin_url, srv.bootstrap, data_dir=Path(tmp), **settings_over
            ) as settings,
        ):
            stack = Stack(settings, Path(tmp))
            obs = await observer(srv.admin_url, settings.require_database_url())
            parts = settings.topic_partitions()
            names = {
                "dispatch": settings.dispatch_topic,
                "events": settings.events_topic,
                "dead_letter": settings.dead_letter_topic,
            }
            topics = {label: (name, parts[name]) for label, name in names.items()}
            run = Run(settings, stack, srv, obs, receiver, topics, args=args)
            try:
                await prepare(run)
                pg_info = await postgres_info(obs)
                windows = await windows_of(run)
                widths = await row_widths(obs)
            finally:
                await obs.conn.close()
                exits = stack.stop()
                server.close()
    return {
        "config": {
            "rate_jobs_per_s": args.rate,
            "load_s": args.load_s,
            "idle_s": args.idle_s,
            "settle_s": args.settle_s,
            "batch_size": args.batch_size,
            "time_scale": args.time_scale,
            "capacity_jobs_per_s": None if jobs_per_s is None else round(jobs_per_s, 2),
            "load_share_of_capacity": None
            if jobs_per_s is None
            else round(args.rate / jobs_per_s, 3),
            "settings": {k: str(v) for k, v in settings_over.items()},
            "postgres": pg_info,
            "processes": "python -m sluicegate api | relay | worker | webhooks",
            "engine": "simulator (sleeps its decode steps: the worker's CPU is Sluicegate's own)",
            "run_s": round(time.monotonic() - started, 1),
        },
        "machine": {
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "clock_ticks_per_s": CLOCK_TICKS,
        },
        **figures(windows),
        "notes": notes(windows),
        "row_widths": widths,
        "windows": windows,
        "exit_codes": exits,
    }


# --- the output ---------------------------------------------------------------------------


def show(report: dict[str, Any]) -> None:
    """The figures, readable; the JSON has them all."""
    windows = {k: w for k, w in report["windows"].items() if k != "idle"}
    gross, net = report["per_job_by_window"], report["per_job_net_of_idle_by_window"]
    print(f"\nper accepted job ({report['machine']['cpu_count']} CPUs; gross | net of idle):")
    head = ["", *(f"{n} ({w['jobs_accepted']} jobs)" for n, w in windows.items())]
    rows = [head]
    for proc in PROCESSES:
        rows.append(
            [
                f"cpu ms {proc}",
                *(
                    f"{gross[n]['cpu_ms'][proc]:.2f} | {net[n]['cpu_ms'][proc]:.2f}"
                    for n in windows
                ),
            ]
        )
    for label, key in (
        ("pg statements", "statements"),
        ("pg stmts w/o BEGIN/COMMIT", "statements_excluding_transaction_control"),
        ("pg transactions", "transactions"),
        ("pg WAL bytes", "wal_bytes"),
        ("pg rows written", "rows_written"),
    ):
        rows.append(
            [label, *(f"{gross[n]['pg'][key]:.1f} | {net[n]['pg'][key]:.1f}" for n in windows)]
        )
    for kind in ("records", "bytes"):
        for topic in TOPICS:
            rows.append(
                [
                    f"kafka {kind} {topic}",
                    *(f"{gross[n]['kafka'][kind][topic]:.2f}" for n in windows),
                ]
            )
    print(columns(rows))
    idle = report["idle_per_s"]
    print("\nidle per s: cpu ms " + ", ".join(f"{k} {v}" for k, v in idle["cpu_ms"].items()))
    print(f"idle per s: pg statements {idle['pg']['statements']}, WAL {idle['pg']['wal_bytes']} B")
    delivery = report.get("per_job", {}).get("webhook_delivery")
    if delivery:
        shown = {k: v for k, v in delivery.items() if k != "detail"}
        print(f"\nwebhook delivery, marginal (gross): {shown}")
    print(
        "\nrow widths: "
        + ", ".join(
            f"{k} {v['bytes_per_row']} B ({v['rows']} rows)"
            for k, v in report["row_widths"].items()
        )
    )
    for note in report["notes"]:
        print(f"note: {note}")
    single = report["windows"].get("single")
    if single:
        print("\ntop statements by calls per job (single):")
        for s in single["top_statements_by_calls"]:
            print(f"  {s['calls_per_job']:7.3f}  {s['mean_ms']} ms  {s['query'][:110]}")


def headline(report: dict[str, Any]) -> dict[str, Any]:
    job = report.get("per_job", {})
    cpu = job.get("cpu_ms", {})
    pg = job.get("pg", {})
    delivery = job.get("webhook_delivery", {})
    return {
        "CPU ms/job api/relay/worker/webhooks": " / ".join(f"{cpu.get(r)}" for r in ROLES),
        "CPU ms/job postgres / broker": f"{cpu.get('postgres')} / {cpu.get('broker')}",
        "PG statements / WAL B / rows per job": (
            f"{pg.get('statements')} / {pg.get('wal_bytes')} / {pg.get('rows_written')}"
        ),
        "webhook delivery CPU ms (webhooks)": delivery.get("cpu_ms_webhooks"),
    }


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--rate", type=float, default=4.5, help="jobs/s offered in each window")
    parser.add_argument("--load-s", type=float, default=75.0, help="seconds of load a window")
    parser.add_argument("--idle-s", type=float, default=30.0, help="the idle window's seconds")
    parser.add_argument(
        "--settle-s", type=float, default=11.0, help="wait after the drain (statistics flush)"
    )
    parser.add_argument(
        "--batch-size", type=int, default=20, help="lines per batch in the batch window (0: none)"
    )
    parser.add_argument("--time-scale", type=float, default=2.0, help="x roofline step time")
    parser.add_argument("--drain-s", type=float, default=120.0, help="longest drain a window")
    parser.add_argument(
        "--capacity-warm-s", type=float, default=10.0, help="engine s before measuring capacity"
    )
    parser.add_argument(
        "--capacity-measure-s",
        type=float,
        default=15.0,
        help="engine s of capacity measured (0: not measured)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run under a minute; writes only with --out"
    )
    parser.add_argument("--out", type=Path, default=None, help="default docs/bench/costs.json")
    return parser


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parser().parse_args(argv)
    if args.quick:
        args.load_s, args.idle_s, args.settle_s = min(args.load_s, 5.0), 3.0, 2.0
        args.time_scale, args.capacity_measure_s = min(args.time_scale, 0.5), 0.0
        args.batch_size, args.drain_s = min(args.batch_size, 9), min(args.drain_s, 30.0)
    logging.basicConfig(level=logging.WARNING)
    report = asyncio.run(measure(args))
    show(report)
    out = args.out or (None if args.quick else OUT)
    if out is not None:
        write_report(report, out, lambda png: plot_costs(report, path=png))
    undrained = [n for n, w in report["windows"].items() if w["jobs_ended"] < w["jobs_accepted"]]
    if undrained:
        print(f"NOT DRAINED: jobs not ended in {undrained}", file=sys.stderr)
    return report


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
