"""Retention: under a sustained load, the database stops growing once the window is reached.

``python -m sluicegate api``, ``relay`` (which prunes), ``worker`` (the simulator at
``--time-scale`` x its roofline time) and ``webhooks`` run as separate processes, as in the
soak (``benchmarks/soak.py``, whose processes, receiver-less load and readiness helpers this
reuses), on embedded PostgreSQL and the embedded broker (or SLUICEGATE_BENCH_DATABASE_URL /
SLUICEGATE_BENCH_KAFKA), with short retention windows so that the run spends several
windows past the first: ``--outbox-s`` (published outbox rows), ``--ended-s`` (ended jobs,
batches, webhook deliveries with their attempts, dead letters), pruned every
``--prune-interval-s``.

The load, for ``--minutes``: ``--load`` x the engine's capacity in all (measured first on
the overload benchmark's job mix, as the soak does; or ``--rate``): a batch of
``--batch-size`` lines with a callback every ``--batch-every-s`` (completion window
``--batch-window``), and Poisson single submits for the rest (the soak's ``offer``, not
retried when refused), each with a callback to a receiver in this process. The default
share is low, 0.35: the capacity is the simulator's alone, and on a 2-core machine the
whole stack (PostgreSQL, the broker, four roles, the load) is the tighter limit; at 0.6
(10.6 jobs/s offered at time scale 2) it sustained about 8 jobs/s, the jobs not ended
climbed to ``lag_hard`` and a quarter of the submits were refused in bursts. The receiver
answers 500, always, to the jobs of a ``--fail-share`` of them (picked by a hash of the job
id), so those deliveries are retried to the end of a short schedule and dead-lettered:
every table retention prunes gets rows.

Every ``--sample-s`` seconds: ``pg_database_size`` of the run's database; for each table,
``pg_total_relation_size`` and its parts (heap, indexes, TOAST), ``count(*)``, and
``pg_stat_user_tables`` (dead tuples, rows inserted and deleted, autovacuum and autoanalyze
counts; its TOAST table's too); the relay's ``sluicegate_pruned_rows_total{table}`` scraped
from its Prometheus port (the relay alone is given ``SLUICEGATE_METRICS_PORT``); the jobs
not ended yet (the load must stay below capacity); each role's CPU share.

The window is reached at ``max(outbox_s, ended_s + batch window) + 2 x prune_interval_s``
from the first submit (a batch is pruned only once past its deadline and ``ended_s``).
Reported: the size over time; the growth from the window to the end of the load (the sample
nearest each, in MiB, % and MiB/min, and the least-squares slope over the samples past the
window); the steady row counts; prune rates by table over the steady part (the counter, and
``n_tup_del`` deltas, which also see ``webhook_attempts``, deleted with their deliveries and
not counted apart) against insert rates; the load's jobs/s; autovacuum runs per table; flat
means the database grew by under 5 % over the second half of the steady part (the first
minutes past the window still grow while the dead rows between two autovacuum runs settle,
reported apart as the settling growth). Afterwards, a drain of up to ``--drain-s`` s checks
that every accepted job and batch reached the receiver: pruning never deleted what was not
ended.

Caveats: ``pg_database_size`` includes the catalogs (a few MiB that do not change), so the
tables' own sum is reported beside it; the statistics views are updated by each backend
about once a second, so a sample's counters trail its sizes by up to that; PostgreSQL
never gives a table's space back to the file system (only trailing empty pages), so "flat"
means the space freed by deletes is reused, which depends on autovacuum having run on the
table between the deletes and the inserts that follow (``autovacuum_naptime``, 60 s by
default, bounds how often it looks at a database); the windows here are seconds and minutes
where production's are an hour and a week, so rows turn over far faster than they would.
Writes docs/bench/retention.json and retention.png.

Not part of ``python -m benchmarks`` (it runs only when named, like the soak).

    python -m benchmarks.retention [--minutes 6] [--ended-s 60] [--outbox-s 30]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import itertools
import json
import logging
import math
import random
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from ipaddress import ip_network
from pathlib import Path
from typing import Any

import asyncpg
import httpx

from benchmarks.harness import (
    OUT_DIR,
    TERMINAL,
    bench_settings,
    columns,
    services,
    write_report,
)
from benchmarks.naive import capacity
from benchmarks.overload import LAG_HARD_S, LAG_SOFT_S
from benchmarks.retention_plot import plot_retention
from benchmarks.soak import (
    ROLES,
    Batches,
    Load,
    Stack,
    api_ready,
    environment,
    offer,
    offer_batches,
    warm_up,
)
from benchmarks.trace import Mix, backlog
from plumbing.db import libpq_url
from schemas import constants
from sluicegate.local.embedded import free_port

OUT = OUT_DIR / "retention.json"
TENANT = "retention"
TABLES = ("jobs", "outbox", "batches", "webhook_deliveries", "webhook_attempts", "dead_letters")
# What the relay's counter labels (attempts go with their deliveries, uncounted).
COUNTED = ("jobs", "outbox", "batches", "webhook_deliveries", "dead_letters")
SHORT = {
    "jobs": "jobs",
    "outbox": "outbox",
    "batches": "batches",
    "webhook_deliveries": "deliveries",
    "webhook_attempts": "attempts",
    "dead_letters": "dead_ltr",
}
MIB = 1024 * 1024
# Flat: the database grows by under this share over the second half of the steady part. The
# first minutes past the window still grow while the dead rows between two autovacuum runs
# settle (reported apart, as the settling growth), so it is not the test of flatness.
FLAT_PCT = 5.0

_PRUNED_LINE = re.compile(
    rf'^{constants.M_PRUNED}\{{[^}}]*table="(?P<table>[a-z_]+)"[^}}]*\}} (?P<value>\S+)$', re.M
)


# --- the processes ------------------------------------------------------------------------


@dataclass
class RetentionStack(Stack):
    """The soak's processes, the relay alone given a Prometheus port (the others would
    try to bind the same one)."""

    relay_metrics_port: int = field(default_factory=free_port)

    def start(self) -> None:
        env = environment(self.settings)
        for role in ROLES:
            own = dict(env)
            if role == "relay":
                own["SLUICEGATE_METRICS_PORT"] = str(self.relay_metrics_port)
            with open(self.directory / f"{role}.log", "wb") as log:
                self.processes[role] = subprocess.Popen(
                    [sys.executable, "-m", "sluicegate", role],
                    env=own,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )


# --- the webhook receiver -----------------------------------------------------------------


def failing(subject: str, share: float) -> bool:
    """Whether the receiver refuses every delivery about ``subject`` (a stable pick)."""
    digest = hashlib.sha256(subject.encode()).digest()
    return int.from_bytes(digest[:4], "big") < share * 2**32


@dataclass
class Receiver:
    """An HTTP server for webhooks: 204, or 500 for the subjects ``failing`` picks."""

    fail_share: float
    port: int = field(default_factory=free_port)
    subjects: set[str] = field(default_factory=set)
    attempts: int = 0
    refused: int = 0

    async def serve(self) -> asyncio.Server:
        return await asyncio.start_server(self._connection, "127.0.0.1", self.port)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError, ValueError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.decode("latin-1").split("\r\n")[1:]:
                    name, _, value = line.partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value.strip())
                body = await reader.readexactly(length)
                self.attempts += 1
                subject = str(json.loads(body).get("data", {}).get("id", "?"))
                self.subjects.add(subject)
                if failing(subject, self.fail_share):
                    self.refused += 1
                    writer.write(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n")
                else:
                    writer.write(b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n")
                await writer.drain()
        writer.close()


# --- batches ------------------------------------------------------------------------------


# --- sampling -----------------------------------------------------------------------------

_TABLES_SQL = """
SELECT c.relname AS name,
       pg_total_relation_size(c.oid) AS total,
       pg_relation_size(c.oid) AS heap,
       pg_indexes_size(c.oid) AS indexes,
       COALESCE(pg_total_relation_size(NULLIF(c.reltoastrelid, 0)), 0) AS toast,
       s.n_live_tup AS live_tup, s.n_dead_tup AS dead_tup,
       s.n_tup_ins AS ins, s.n_tup_upd AS upd, s.n_tup_del AS del,
       s.autovacuum_count AS autovacuums, s.autoanalyze_count AS autoanalyzes,
       s.last_autovacuum AS last_autovacuum,
       COALESCE(t.n_dead_tup, 0) AS toast_dead_tup,
       COALESCE(t.autovacuum_count, 0) AS toast_autovacuums
FROM pg_class c
JOIN pg_stat_user_tables s ON s.relid = c.oid
LEFT JOIN pg_stat_all_tables t ON t.relid = c.reltoastrelid
WHERE c.relnamespace = 'public'::regnamespace
"""

_INDEXES_SQL = """
SELECT relname AS table, indexrelname AS index, pg_relation_size(indexrelid) AS bytes
FROM pg_stat_user_indexes WHERE schemaname = 'public' AND relname = ANY($1::text[])
"""

_SETTINGS_SQL = """
SELECT name, setting, unit FROM pg_settings
WHERE name LIKE 'autovacuum%' OR name IN ('shared_buffers', 'server_version', 'track_counts')
ORDER BY name
"""


async def database_sample(conn: asyncpg.Connection) -> dict[str, Any]:
    """The database's size and each table's sizes, rows and statistics, now."""
    size = int(await conn.fetchval("SELECT pg_database_size(current_database())"))
    tables: dict[str, dict[str, Any]] = {}
    others = 0
    for row in await conn.fetch(_TABLES_SQL):
        if row["name"] not in TABLES:
            others += int(row["total"])
            continue
        entry = {k: v for k, v in row.items() if k not in ("name", "last_autovacuum")}
        last = row["last_autovacuum"]
        entry["last_autovacuum"] = None if last is None else last.isoformat()
        entry["rows"] = int(await conn.fetchval(f'SELECT count(*) FROM "{row["name"]}"'))
        tables[row["name"]] = entry
    unfinished = await conn.fetchval(
        "SELECT count(*) FROM jobs WHERE state::text <> ALL($1::text[])", sorted(TERMINAL)
    )
    indexes = {r["index"]: int(r["bytes"]) for r in await conn.fetch(_INDEXES_SQL, list(TABLES))}
    return {
        "database_bytes": size,
        "tables": tables,
        "index_bytes": indexes,
        "other_tables_bytes": others,
        "unfinished_jobs": int(unfinished),
    }


async def storage(conn: asyncpg.Connection) -> dict[str, Any]:
    """How full each table's and index's pages are (pgstattuple, created in the run's
    database, which is dropped after); a note when the extension is missing."""
    try:
        await conn.execute("CREATE EXTENSION IF NOT EXISTS pgstattuple")
    except asyncpg.PostgresError as exc:
        return {"note": f"pgstattuple not available: {exc}"}
    out: dict[str, Any] = {"tables": {}, "indexes": {}}
    for name in TABLES:
        row = await conn.fetchrow(
            "SELECT table_len, tuple_percent, dead_tuple_percent, free_percent "
            "FROM pgstattuple($1::regclass)",
            name,
        )
        if row is not None:
            out["tables"][name] = {k: float(v) for k, v in row.items()}
    for row in await conn.fetch(_INDEXES_SQL, list(TABLES)):
        try:
            found = await conn.fetchrow(
                "SELECT leaf_pages, empty_pages, deleted_pages, avg_leaf_density "
                "FROM pgstatindex($1::regclass)",
                row["index"],
            )
        except asyncpg.PostgresError:
            continue  # not a B-tree
        if found is not None:
            out["indexes"][row["index"]] = {
                "table": row["table"],
                "bytes": int(row["bytes"]),
                **{k: float(v) for k, v in found.items()},
            }
    return out


async def pruned_counter(client: httpx.AsyncClient, port: int) -> dict[str, float] | None:
    """The relay's ``sluicegate_pruned_rows_total`` by table (None: not scraped)."""
    try:
        r = await client.get(f"http://127.0.0.1:{port}/metrics")
    except httpx.HTTPError:
        return None
    if r.status_code != 200:
        return None
    found = {m["table"]: float(m["value"]) for m in _PRUNED_LINE.finditer(r.text)}
    return {t: found.get(t, 0.0) for t in COUNTED}


@dataclass
class Sampler:
    stack: RetentionStack
    url: str
    load: Load
    batches: Batches
    receiver: Receiver
    every_s: float
    t0: float
    samples: list[dict[str, Any]] = field(default_factory=list)

    async def run(self) -> None:
        conn = await asyncpg.connect(self.url)
        scraper = httpx.AsyncClient(timeout=5.0)
        cpu_before: dict[str, float] = {}
        last = time.monotonic()
        try:
            while True:
                last, cpu_before = await self.take(conn, scraper, last, cpu_before)
                self.stack.check()
                await asyncio.sleep(max(0.0, last + self.every_s - time.monotonic()))
        finally:
            await scraper.aclose()
            await conn.close()

    async def take(
        self,
        conn: asyncpg.Connection,
        scraper: httpx.AsyncClient,
        last: float,
        cpu_before: dict[str, float],
    ) -> tuple[float, dict[str, float]]:
        """One sample; when it was taken and each role's CPU seconds then."""
        now = time.monotonic()
        _, cpu = self.stack.memory()
        database = await database_sample(conn)
        pruned = await pruned_counter(scraper, self.stack.relay_metrics_port)
        span = max(now - last, 1e-9)
        self.samples.append(
            {
                "at_s": round(now - self.t0, 1),
                **database,
                "pruned_total": pruned,
                "accepted_jobs": len(self.load.accepted),
                "refused_submits": sum(a.status != 202 for a in self.load.answers),
                "batch_jobs_accepted": sum(self.batches.accepted.values()),
                "webhook_attempts_received": self.receiver.attempts,
                "cpu_share": {
                    k: round((v - cpu_before[k]) / span, 3)
                    for k, v in cpu.items()
                    if k in cpu_before
                },
            }
        )
        return now, cpu


# --- the figures --------------------------------------------------------------------------


def slope_per_min(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, value), per minute."""
    if len(points) < 2:
        return float("nan")
    mx = sum(x for x, _ in points) / len(points)
    my = sum(y for _, y in points) / len(points)
    sxx = sum((x - mx) ** 2 for x, _ in points)
    sxy = sum((x - mx) * (y - my) for x, y in points)
    return sxy / sxx * 60 if sxx else float("nan")


def table_bytes(sample: dict[str, Any]) -> int:
    return sum(int(t["total"]) for t in sample["tables"].values())


def growth(
    samples: list[dict[str, Any]], window_s: float, load_s: float
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Sizes at the window and at the end of the load, and the steady samples between."""
    during = [s for s in samples if s["at_s"] <= load_s + 1.0]
    steady = [s for s in during if s["at_s"] >= window_s]
    if len(steady) < 2:
        return {"note": "the load ended before the window was reached"}, steady
    first, end = steady[0], steady[-1]
    minutes = (end["at_s"] - first["at_s"]) / 60

    def figures(value: Any) -> dict[str, float]:
        a, b = value(first) / MIB, value(end) / MIB
        return {
            "at_window_mib": round(a, 3),
            "at_end_mib": round(b, 3),
            "growth_mib": round(b - a, 3),
            "growth_pct": round(100 * (b - a) / a, 2) if a else float("nan"),
            "growth_mib_per_min": round((b - a) / minutes, 4),
            "slope_mib_per_min": round(
                slope_per_min([(s["at_s"], value(s) / MIB) for s in steady]), 4
            ),
        }

    def table(name: str) -> dict[str, Any]:
        out: dict[str, Any] = figures(lambda s: s["tables"][name]["total"])
        out["growth_mib_by_part"] = {
            part: round((end["tables"][name][key] - first["tables"][name][key]) / MIB, 3)
            for part, key in (("heap", "heap"), ("indexes", "indexes"), ("toast", "toast"))
        }
        return out

    middle = min(steady, key=lambda s: abs(s["at_s"] - (first["at_s"] + end["at_s"]) / 2))
    second_half_min = (end["at_s"] - middle["at_s"]) / 60
    out: dict[str, Any] = {
        "window_sample_at_s": first["at_s"],
        "end_sample_at_s": end["at_s"],
        "steady_minutes": round(minutes, 2),
        "database": figures(lambda s: s["database_bytes"]),
        "tables_sum": figures(table_bytes),
        "by_table": {name: table(name) for name in TABLES if name in first["tables"]},
        "index_growth_kib": dict(
            sorted(
                (
                    (name, round((end["index_bytes"][name] - size) / 1024, 1))
                    for name, size in first["index_bytes"].items()
                    if name in end["index_bytes"]
                ),
                key=lambda kv: -kv[1],
            )
        ),
        # The same from the middle of the steady part: is what growth there is settling?
        "second_half": {
            "from_s": middle["at_s"],
            "database_growth_mib": round(
                (end["database_bytes"] - middle["database_bytes"]) / MIB, 3
            ),
            "database_growth_mib_per_min": round(
                (end["database_bytes"] - middle["database_bytes"]) / MIB / second_half_min, 4
            )
            if second_half_min
            else None,
            "tables_growth_mib": round((table_bytes(end) - table_bytes(middle)) / MIB, 3),
        },
    }
    half = out["second_half"]
    half["database_growth_pct"] = round(
        100 * (end["database_bytes"] - middle["database_bytes"]) / middle["database_bytes"], 2
    )
    half["settling_growth_mib"] = round(
        (middle["database_bytes"] - first["database_bytes"]) / MIB, 3
    )
    out["flat"] = abs(half["database_growth_pct"]) < FLAT_PCT
    out["flat_rule"] = f"|database growth over the second half of the steady part| < {FLAT_PCT} %"
    return out, steady


def steady_rows(steady: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    out = {}
    for name in TABLES:
        rows = [s["tables"][name]["rows"] for s in steady if name in s["tables"]]
        dead = [s["tables"][name]["dead_tup"] for s in steady if name in s["tables"]]
        if rows:
            out[name] = {
                "mean": round(sum(rows) / len(rows), 1),
                "min": min(rows),
                "max": max(rows),
                "dead_tup_mean": round(sum(dead) / len(dead), 1),
                "dead_tup_max": max(dead),
            }
    return out


def rates(steady: list[dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """Rows/s over the steady samples: pruned (counter), deleted and inserted (statistics)."""
    if len(steady) < 2:
        return {}
    first, end = steady[0], steady[-1]
    span = end["at_s"] - first["at_s"]
    out: dict[str, dict[str, float | None]] = {}
    for name in TABLES:
        a, b = first["tables"].get(name), end["tables"].get(name)
        if a is None or b is None:
            continue
        counted: float | None = None
        if name in COUNTED and first["pruned_total"] and end["pruned_total"]:
            counted = round((end["pruned_total"][name] - first["pruned_total"][name]) / span, 2)
        deleted = (b["del"] - a["del"]) / span
        inserted = (b["ins"] - a["ins"]) / span
        out[name] = {
            "pruned_per_s_counter": counted,
            "deleted_per_s_stats": round(deleted, 2),
            "inserted_per_s_stats": round(inserted, 2),
            "deleted_over_inserted": round(deleted / inserted, 3) if inserted else None,
        }
    return out


def autovacuum(samples: list[dict[str, Any]], window_s: float) -> dict[str, dict[str, Any]]:
    """Per table: autovacuum runs (counted from the statistics between samples) and when."""
    out: dict[str, dict[str, Any]] = {}
    for name in TABLES:
        series = [(s["at_s"], s["tables"][name]) for s in samples if name in s["tables"]]
        if not series:
            continue
        runs, toast_runs = [], []
        for (_, before), (at, after) in itertools.pairwise(series):
            if after["autovacuums"] > before["autovacuums"]:
                runs.append(at)
            if after["toast_autovacuums"] > before["toast_autovacuums"]:
                toast_runs.append(at)
        end = series[-1][1]
        out[name] = {
            "autovacuum_count": end["autovacuums"],
            "autoanalyze_count": end["autoanalyzes"],
            "toast_autovacuum_count": end["toast_autovacuums"],
            "runs_seen_at_s": runs,
            "runs_past_window": sum(1 for at in runs if at >= window_s),
            "toast_runs_seen_at_s": toast_runs,
            "last_autovacuum": end["last_autovacuum"],
            "dead_tup_at_end": end["dead_tup"],
            "dead_tup_max": max(t["dead_tup"] for _, t in series),
            "toast_dead_tup_max": max(t["toast_dead_tup"] for _, t in series),
        }
    return out


def size_table(samples: list[dict[str, Any]], every_s: float, window_s: float) -> str:
    """The size over time, one row about every ``every_s``."""
    head = [
        "t s",
        "db MiB",
        "tables MiB",
        *(SHORT[n] for n in TABLES),
        "jobs rows",
        "outbox rows",
        "dead tup",
        "autovacuumed since",
    ]
    lines = [head]
    next_at = -1.0
    before: dict[str, Any] = samples[0]["tables"] if samples else {}
    for i, s in enumerate(samples):
        if s["at_s"] < next_at and i != len(samples) - 1:
            continue
        next_at = s["at_s"] + every_s
        t = s["tables"]
        vacuumed = [
            n
            for n in TABLES
            if n in t and n in before and t[n]["autovacuums"] > before[n]["autovacuums"]
        ]
        before = t
        mark = "*" if s["at_s"] >= window_s else ""
        lines.append(
            [
                f"{s['at_s']:.0f}{mark}",
                f"{s['database_bytes'] / MIB:.2f}",
                f"{table_bytes(s) / MIB:.2f}",
                *(f"{t[n]['total'] / MIB:.2f}" if n in t else "-" for n in TABLES),
                str(t.get("jobs", {}).get("rows", "-")),
                str(t.get("outbox", {}).get("rows", "-")),
                str(sum(v["dead_tup"] for v in t.values())),
                ",".join(SHORT[n] for n in vacuumed) or "-",
            ]
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    text = "\n".join(
        "  ".join(c.rjust(w) for c, w in zip(line, widths, strict=True)) for line in lines
    )
    return text + "\n(* past the window; sizes are pg_total_relation_size: heap, indexes, TOAST)"


# --- the run ------------------------------------------------------------------------------


def window_s(args: argparse.Namespace) -> float:
    batch = window_seconds(args.batch_window) if args.batch_every_s > 0 else 0.0
    return float(max(args.outbox_s, args.ended_s + batch) + 2 * args.prune_interval_s)


def window_seconds(window: str) -> float:
    match = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?", window)
    if not match or not window:
        raise SystemExit(f"--batch-window {window!r} is not a duration such as 1m or 90s")
    h, m, s = (int(g or 0) for g in match.groups())
    return h * 3600.0 + m * 60.0 + s


async def wait_delivered(
    receiver: Receiver, wanted: set[str], limit_s: float
) -> tuple[float, set[str]]:
    """Until the receiver has heard of every one of ``wanted``, or ``limit_s``."""
    started = time.monotonic()
    for _ in range(math.ceil(limit_s)):
        if wanted <= receiver.subjects:
            break
        await asyncio.sleep(1.0)
    return time.monotonic() - started, wanted - receiver.subjects


async def run(args: argparse.Namespace) -> dict[str, Any]:
    mix = Mix()
    if args.rate is None:
        print(f"measuring the engine's capacity (time scale {args.time_scale}) ...", flush=True)
        cap = await capacity(
            mix,
            time_scale=args.time_scale,
            warm_s=args.capacity_warm_s,
            measure_s=args.capacity_measure_s,
        )
        jobs_per_s, service_p99_s, token_s = (
            cap.jobs_per_s,
            cap.service_p99_s,
            cap.decode_s_per_token,
        )
    else:
        jobs_per_s, service_p99_s, token_s = args.rate / args.load, 30.0, None
    batch_rate = args.batch_size / args.batch_every_s if args.batch_every_s > 0 else 0.0
    rate = max(0.1, jobs_per_s * args.load - batch_rate)
    print(
        f"capacity {jobs_per_s:.2f} jobs/s; offering {rate:.2f} single jobs/s and "
        f"{batch_rate:.2f} batch jobs/s",
        flush=True,
    )
    receiver = Receiver(fail_share=args.fail_share)
    server = await receiver.serve()
    overrides: dict[str, object] = {
        "api_port": free_port(),
        "partitions": 4,
        "lag_soft": max(8, round(jobs_per_s * (service_p99_s + LAG_SOFT_S))),
        "lag_hard": max(16, round(jobs_per_s * (service_p99_s + LAG_HARD_S))),
        "max_block_ms": 1000,
        "deadline_aware": False,
        "retry_after_max_s": 10.0,
        "max_input_bytes": 1_000_000,
        "sim_time_scale": args.time_scale,
        "webhook_allow_networks": (ip_network("127.0.0.0/8"),),
        "webhook_retry_schedule_s": (0.0, 1.0, 5.0),
        "retention_outbox_s": args.outbox_s,
        "retention_ended_s": args.ended_s,
        "prune_interval_s": args.prune_interval_s,
        "prune_batch_rows": args.prune_batch_rows,
    }
    if token_s is not None:
        overrides["expected_token_time_s"] = token_s
    callback = f"http://127.0.0.1:{receiver.port}/hook"
    load, batches = Load(), Batches()
    rng, docs = random.Random(17), backlog(200, Mix(), seed=19)  # the batches' documents
    window = window_s(args)
    with tempfile.TemporaryDirectory(prefix="sluicegate-retention-") as tmp:
        async with (
            services() as (admin, bootstrap),
            bench_settings(admin, bootstrap, data_dir=Path(tmp), **overrides) as settings,
        ):
            stack = RetentionStack(settings, Path(tmp))
            url = libpq_url(settings.require_database_url())
            client = httpx.AsyncClient(
                base_url=f"http://127.0.0.1:{settings.api_port}",
                headers={constants.HEADER_TENANT: TENANT},
                limits=httpx.Limits(max_connections=512),
                timeout=60.0,
            )
            conn = await asyncpg.connect(url)
            try:
                pg = {r["name"]: (r["setting"], r["unit"]) for r in await conn.fetch(_SETTINGS_SQL)}
                stack.start()
                await api_ready(client, stack)
                (await client.post("/v1/webhooks/secrets")).raise_for_status()
                await warm_up(client, settings.speed_min_samples)
                print(
                    f"stack up; {args.minutes} min of load, window reached at {window:.0f} s",
                    flush=True,
                )
                t0 = time.monotonic()
                sampler = Sampler(stack, url, load, batches, receiver, args.sample_s, t0)
                sampling = asyncio.create_task(sampler.run())
                seconds = args.minutes * 60
                loads = [asyncio.create_task(offer(client, load, rate, seconds, callback))]
                if args.batch_every_s > 0:
                    loads.append(
                        asyncio.create_task(
                            offer_batches(
                                client,
                                batches,
                                lambda _: docs[rng.randrange(len(docs))],
                                every_s=args.batch_every_s,
                                size=args.batch_size,
                                window=args.batch_window,
                                seconds=seconds,
                                callback=callback,
                            )
                        )
                    )
                loading = asyncio.gather(*loads)
                either: set[asyncio.Future[Any]] = {loading, sampling}
                await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
                if sampling.done():  # a role died, or sampling failed: say why
                    loading.cancel()
                    await sampling
                await loading
                load_s = time.monotonic() - t0
                await asyncio.sleep(max(0.0, t0 + seconds + args.sample_s - time.monotonic()))
                sampling.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sampling
                pages = await storage(conn)  # as the load ends, before the drain
                wanted = set(load.accepted) | set(batches.accepted)
                print(f"load done; waiting for {len(wanted)} webhooks ...", flush=True)
                drained_s, missing = await wait_delivered(receiver, wanted, args.drain_s)
                # Jobs that reached the receiver but whose rows are gone are the pruner's
                # work; jobs still stored and not ended would be lost work.
                unended_left = await conn.fetchval(
                    "SELECT count(*) FROM jobs WHERE tenant = $1 AND state::text <> ALL($2)",
                    TENANT,
                    sorted(TERMINAL),
                )
            finally:
                await conn.close()
                await client.aclose()
                exits = stack.stop()
                server.close()
    samples = sampler.samples
    grew, steady = growth(samples, window, load_s)
    answers = Counter(str(a.status) for a in load.answers)
    report: dict[str, Any] = {
        "config": {
            "minutes": args.minutes,
            "time_scale": args.time_scale,
            "capacity_jobs_per_s": round(jobs_per_s, 2),
            "capacity": "measured" if args.rate is None else "from --rate / --load",
            "load_share_of_capacity": args.load,
            "single_jobs_offered_per_s": round(rate, 2),
            "batch_jobs_offered_per_s": round(batch_rate, 2),
            "batch_size": args.batch_size,
            "batch_every_s": args.batch_every_s,
            "batch_window": args.batch_window,
            "fail_share": args.fail_share,
            "retention_outbox_s": args.outbox_s,
            "retention_ended_s": args.ended_s,
            "prune_interval_s": args.prune_interval_s,
            "prune_batch_rows": args.prune_batch_rows,
            "window_reached_s": window,
            "sample_s": args.sample_s,
            "postgres": {k: f"{v}{'' if u is None else ' ' + u}" for k, (v, u) in pg.items()},
            "settings": {k: str(v) for k, v in overrides.items()},
            "processes": "python -m sluicegate api | relay | worker | webhooks",
        },
        "load": {
            "load_s": round(load_s, 1),
            "single_submits": len(load.answers) + load.not_sent,
            "single_accepted": len(load.accepted),
            "single_answers": dict(answers),
            "single_refused_by_reason": dict(
                Counter(str(a.reason) for a in load.answers if a.status != 202)
            ),
            "batches_accepted": len(batches.accepted),
            "batches_refused": dict(batches.refused),
            "accepted_jobs_per_s": round(
                (len(load.accepted) + sum(batches.accepted.values())) / load_s, 2
            ),
            "single_accepted_per_s": round(len(load.accepted) / load_s, 2),
            "batch_jobs_accepted_per_s": round(sum(batches.accepted.values()) / load_s, 2),
            "unfinished_jobs_max": max((s["unfinished_jobs"] for s in samples), default=0),
        },
        "growth_after_window": grew,
        "steady_rows": steady_rows(steady),
        "rates_steady": rates(steady),
        "autovacuum": autovacuum(samples, window),
        "storage_at_load_end": pages,
        "end": {
            "webhook_attempts_received": receiver.attempts,
            "webhook_attempts_refused": receiver.refused,
            "subjects_never_delivered": len(missing),
            "subjects_never_delivered_ids": sorted(missing)[:20],
            "drain_s": round(drained_s, 1),
            "unended_jobs_left": int(unended_left),
            "exit_codes": exits,
        },
        "samples": samples,
    }
    return report


def headline(report: dict[str, Any]) -> dict[str, Any]:
    grew = report["growth_after_window"]
    db = grew.get("database", {})
    jobs = report["steady_rows"].get("jobs", {})
    return {
        "database MiB at window / end": f"{db.get('at_window_mib')} / {db.get('at_end_mib')}",
        "growth after window %": db.get("growth_pct"),
        "growth MiB/min (slope)": db.get("slope_mib_per_min"),
        "steady jobs rows": jobs.get("mean"),
        "load jobs/s": report["load"]["accepted_jobs_per_s"],
    }


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--minutes", type=float, default=6.0, help="of load")
    parser.add_argument("--outbox-s", type=float, default=30.0, help="retention_outbox_s")
    parser.add_argument("--ended-s", type=float, default=60.0, help="retention_ended_s")
    parser.add_argument("--prune-interval-s", type=float, default=5.0, help="prune_interval_s")
    parser.add_argument("--prune-batch-rows", type=int, default=1000, help="prune_batch_rows")
    parser.add_argument(
        "--load", type=float, default=0.35, help="x the engine's capacity, batches included"
    )
    parser.add_argument(
        "--rate", type=float, default=None, help="jobs/s in all (skips measuring capacity)"
    )
    parser.add_argument("--time-scale", type=float, default=2.0, help="x roofline step time")
    parser.add_argument("--batch-size", type=int, default=20, help="lines per batch")
    parser.add_argument(
        "--batch-every-s", type=float, default=15.0, help="seconds between batches (0: none)"
    )
    parser.add_argument("--batch-window", default="1m", help="the batches' completion_window")
    parser.add_argument(
        "--fail-share", type=float, default=0.05, help="jobs whose webhooks always get 500"
    )
    parser.add_argument("--sample-s", type=float, default=5.0)
    parser.add_argument("--drain-s", type=float, default=60.0, help="longest wait after load")
    parser.add_argument(
        "--capacity-warm-s", type=float, default=20.0, help="engine s before measuring capacity"
    )
    parser.add_argument(
        "--capacity-measure-s", type=float, default=30.0, help="engine s of capacity measured"
    )
    parser.add_argument(
        "--quick", action="store_true", help="a 1.5-minute smoke run; writes only with --out"
    )
    parser.add_argument("--out", type=Path, default=None, help="default docs/bench/retention.json")
    return parser


def show(report: dict[str, Any]) -> None:
    """The figures, readable; the JSON has them all."""
    cfg, load, grew = report["config"], report["load"], report["growth_after_window"]
    rows: list[tuple[str, ...]]
    shown = [
        "server_version",
        "autovacuum_naptime",
        "autovacuum_vacuum_scale_factor",
        "autovacuum_vacuum_threshold",
        "autovacuum_vacuum_cost_delay",
    ]
    pg = cfg["postgres"]
    print(f"\nPostgreSQL: {', '.join(f'{k}={pg[k]}' for k in shown if k in pg)}")
    print(
        f"load: {load['accepted_jobs_per_s']} jobs/s accepted over {load['load_s']} s "
        f"({load['single_accepted_per_s']} single, {load['batch_jobs_accepted_per_s']} in "
        f"{load['batches_accepted']} batches; capacity {cfg['capacity_jobs_per_s']} jobs/s); "
        f"single answers {load['single_answers']} (refused: "
        f"{load['single_refused_by_reason']}), batches refused {load['batches_refused']}; "
        f"jobs not ended at most {load['unfinished_jobs_max']}"
    )
    print(f"\nsize over time (window reached at {cfg['window_reached_s']:.0f} s):")
    print(size_table(report["samples"], max(30.0, cfg["sample_s"]), cfg["window_reached_s"]))
    if "database" not in grew:
        print(grew.get("note"))
    else:
        print(
            f"\ngrowth from the window ({grew['window_sample_at_s']} s) to the end of the load "
            f"({grew['end_sample_at_s']} s, {grew['steady_minutes']} min):"
        )
        rows = [("", "at window", "at end", "MiB", "%", "MiB/min", "slope MiB/min")]
        named = [("database", grew["database"]), ("tables (sum)", grew["tables_sum"])]
        for name, fig in [*named, *grew["by_table"].items()]:
            rows.append(
                (
                    name,
                    f"{fig['at_window_mib']:.3f}",
                    f"{fig['at_end_mib']:.3f}",
                    f"{fig['growth_mib']:+.3f}",
                    f"{fig['growth_pct']:+.2f}",
                    f"{fig['growth_mib_per_min']:+.4f}",
                    f"{fig['slope_mib_per_min']:+.4f}",
                )
            )
        print(columns(rows))
        top = list(grew["index_growth_kib"].items())[:8]
        print("indexes that grew most (KiB): " + ", ".join(f"{n} {v:+.0f}" for n, v in top))
        half = grew["second_half"]
        print(
            f"settling (window to {half['from_s']} s): database "
            f"{half['settling_growth_mib']:+.3f} MiB; second half: database"
            f" {half['database_growth_mib']:+.3f} MiB ({half['database_growth_pct']:+.2f} %,"
            f" {half['database_growth_mib_per_min']} MiB/min), tables "
            f"{half['tables_growth_mib']:+.3f} MiB; flat ({grew['flat_rule']}): {grew['flat']}"
        )
    rows = [("steady", "rows mean", "min", "max", "dead tup mean", "dead max")]
    for name, r in report["steady_rows"].items():
        rows.append(
            (
                name,
                f"{r['mean']:.0f}",
                str(r["min"]),
                str(r["max"]),
                f"{r['dead_tup_mean']:.0f}",
                str(r["dead_tup_max"]),
            )
        )
    print("\n" + columns(rows))
    rows = [("rows/s, steady", "pruned (counter)", "deleted (stats)", "inserted", "del/ins")]
    for name, r in report["rates_steady"].items():
        rows.append(
            (
                name,
                "-" if r["pruned_per_s_counter"] is None else f"{r['pruned_per_s_counter']}",
                f"{r['deleted_per_s_stats']}",
                f"{r['inserted_per_s_stats']}",
                "-" if r["deleted_over_inserted"] is None else f"{r['deleted_over_inserted']}",
            )
        )
    print("\n" + columns(rows))
    rows = [("autovacuum", "runs", "past window", "seen at s", "toast runs", "autoanalyze")]
    for name, r in report["autovacuum"].items():
        rows.append(
            (
                name,
                str(r["autovacuum_count"]),
                str(r["runs_past_window"]),
                ",".join(f"{at:.0f}" for at in r["runs_seen_at_s"]) or "-",
                str(r["toast_autovacuum_count"]),
                str(r["autoanalyze_count"]),
            )
        )
    print("\n" + columns(rows))
    pages = report["storage_at_load_end"]
    if "tables" in pages:
        rows = [("pgstattuple, load end", "KiB", "live %", "dead %", "free %")]
        for name, t in pages["tables"].items():
            rows.append(
                (
                    name,
                    f"{t['table_len'] / 1024:.0f}",
                    f"{t['tuple_percent']:.1f}",
                    f"{t['dead_tuple_percent']:.1f}",
                    f"{t['free_percent']:.1f}",
                )
            )
        print("\n" + columns(rows))
        rows = [
            ("pgstatindex, load end", "KiB", "leaf pages", "empty", "deleted", "leaf density %")
        ]
        for name, i in pages["indexes"].items():
            rows.append(
                (
                    name,
                    f"{i['bytes'] / 1024:.0f}",
                    f"{i['leaf_pages']:.0f}",
                    f"{i['empty_pages']:.0f}",
                    f"{i['deleted_pages']:.0f}",
                    f"{i['avg_leaf_density']:.1f}",
                )
            )
        print("\n" + columns(rows))
    else:
        print(pages.get("note"))
    print("\n" + json.dumps(report["end"], indent=1))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parser().parse_args(argv)
    if args.quick:
        args.minutes = min(args.minutes, 1.5)
        args.outbox_s, args.ended_s = min(args.outbox_s, 10.0), min(args.ended_s, 20.0)
        args.prune_interval_s, args.sample_s = min(args.prune_interval_s, 3.0), 3.0
        args.batch_window, args.drain_s = "20s", min(args.drain_s, 30.0)
        args.capacity_warm_s, args.capacity_measure_s = 8.0, 6.0
    if not 0 < args.load < 1:
        raise SystemExit("--load must be a share of the capacity below 1")
    logging.basicConfig(level=logging.WARNING)
    report = asyncio.run(run(args))
    show(report)
    out = args.out or (None if args.quick else OUT)
    if out is not None:
        write_report(report, out, lambda png: plot_retention(report, path=png))
    grew = report["growth_after_window"]
    if grew.get("flat") is False:
        print(f"NOT FLAT: {grew['flat_rule']} does not hold", file=sys.stderr)
    if report["end"]["subjects_never_delivered"] or report["end"]["unended_jobs_left"]:
        print("FAILED: jobs or batches never reached the receiver", file=sys.stderr)
    return report


if __name__ == "__main__":
    main()
