"""PostgreSQL as the costs benchmark reads it: a connection of its own role to the run's
database (its own statements counted, to be taken away from the stack's), the database's
counters at a mark (transactions, WAL, rows written by table), the statements run since
``pg_stat_statements`` was reset, and each table's bytes per row."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import asyncpg

from benchmarks.lib.stack import TERMINAL
from plumbing.db import libpq_url

OBSERVER = "costs_observer"  # the role of this benchmark's own connection
WIDTH_TABLES = ("jobs", "outbox", "batches", "webhook_deliveries", "webhook_attempts")
TRANSACTION_CONTROL = re.compile(r"^\s*(BEGIN|COMMIT|ROLLBACK|START|SAVEPOINT|RELEASE)\b", re.I)
TOP_N = 25  # every statement a job or its load brings runs at least once a job or a second
TOP_N_IDLE = 40  # the idle window lists (nearly) every statement a quiet stack runs

Flat = dict[str, float]  # a window's counters, by dotted name ("cpu_ms.api", "pg.statements")


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


def top_statements(
    statements: list[dict[str, Any]], jobs: int, key: str, top_n: int = TOP_N
) -> list[dict[str, Any]]:
    """The ``top_n`` statements by ``key``, per job, their text shortened."""
    ranked = sorted(statements, key=lambda s: -float(s[key]))[:top_n]
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


async def postgres_info(obs: Observer) -> dict[str, str]:
    rows = await obs.fetch(
        "SELECT name, setting FROM pg_settings WHERE name IN ('server_version', "
        "'shared_preload_libraries', 'shared_buffers', 'checkpoint_timeout', 'max_wal_size', "
        "'synchronous_commit', 'wal_level', 'full_page_writes', 'pg_stat_statements.track', "
        "'pg_stat_statements.track_utility')"
    )
    return {r["name"]: r["setting"] for r in rows}


async def ended_states(obs: Observer, tenant: str) -> dict[str, int]:
    rows = await obs.fetch(
        "SELECT state::text AS state, count(*) AS n FROM jobs WHERE tenant = $1 GROUP BY 1",
        tenant,
    )
    return {r["state"]: int(r["n"]) for r in rows if r["state"] in TERMINAL}
