"""The run's database as the retention benchmark samples it: its size, each table's sizes
(heap, indexes, TOAST), rows and statistics (dead tuples, inserts and deletes, autovacuum
runs), how full the pages are (pgstattuple), and the relay's pruned-rows counter."""

from __future__ import annotations

import re
from typing import Any

import asyncpg
import httpx

from benchmarks.lib.stack import TERMINAL
from schemas import constants

TABLES = ("jobs", "outbox", "batches", "webhook_deliveries", "webhook_attempts", "dead_letters")
# What the relay's counter labels (attempts go with their deliveries, uncounted).
COUNTED = ("jobs", "outbox", "batches", "webhook_deliveries", "dead_letters")

_PRUNED_LINE = re.compile(
    rf'^{constants.M_PRUNED}\{{[^}}]*table="(?P<table>[a-z_]+)"[^}}]*\}} (?P<value>\S+)$', re.M
)

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

SETTINGS_SQL = """
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


async def pruned_counter(client: httpx.AsyncClient, port: int | None) -> dict[str, float] | None:
    """The relay's ``sluicegate_pruned_rows_total`` by table (None: not scraped)."""
    if port is None:
        return None
    try:
        r = await client.get(f"http://127.0.0.1:{port}/metrics")
    except httpx.HTTPError:
        return None
    if r.status_code != 200:
        return None
    found = {m["table"]: float(m["value"]) for m in _PRUNED_LINE.finditer(r.text)}
    return {t: found.get(t, 0.0) for t in COUNTED}
