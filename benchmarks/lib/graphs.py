"""The graphs benchmark's pieces: its servers and its document, a document's graph read back
from its rows (the map's and each level's span), which worker held which dispatch partition,
the map's time by the simulator's roofline alone (no CPU, no pipeline) for a given spread of
its chunks, and the figures per job and the speed-ups."""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil
from confluent_kafka.admin import AdminClient

from benchmarks.lib.costs.observer import Observer
from benchmarks.lib.costs.windows import Servers
from benchmarks.lib.costs.windows import servers as costs_servers
from benchmarks.lib.long_text import long_document
from schemas.jobs import JobKind
from workers.engines.base import GenerationRequest
from workers.engines.sim.engine import SimEngine
from workers.engines.sim.tokens import count_tokens

TOKENS_PER_PAGE = 500
MAX_CONNECTIONS = 400  # 16 workers' pools and LISTEN connections beside the other roles
PG_KEYS = ("statements", "statements_excluding_transaction_control", "transactions")
GRAPH_ROWS = """
SELECT id::text AS id, parent_id::text AS parent_id, level, seq, state, attempt, input,
       created_at, started_at, finished_at, dispatch_partition
FROM jobs WHERE id = $1::uuid OR parent_id = $1::uuid ORDER BY level NULLS FIRST, seq
"""
TENANT_ROWS = """
SELECT id::text AS id, state, attempt, input, created_at, started_at, finished_at,
       dispatch_partition
FROM jobs WHERE tenant = $1 ORDER BY created_at
"""


def span(rows: Sequence[Mapping[str, Any]]) -> float:
    """Seconds from the first start to the last end of ``rows``."""
    return seconds(min(r["started_at"] for r in rows), max(r["finished_at"] for r in rows))


def seconds(a: datetime, b: datetime) -> float:
    return round((b - a).total_seconds(), 3)


async def graph_rows(obs: Observer, document: str) -> list[dict[str, Any]]:
    return [dict(r) for r in await obs.fetch(GRAPH_ROWS, document)]


def timeline(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The document's graph as it ran: its chunks and levels, the time to its first chunk's
    start (the cut and the dispatch), the map's span, each reduce level's, the total."""
    doc, parts = rows[0], rows[1:]
    by_level: dict[int, list[Mapping[str, Any]]] = defaultdict(list)
    for r in parts:
        by_level[int(r["level"])].append(r)
    chunks = by_level[0]
    return {
        "state": doc["state"],
        "chunks": len(chunks),
        "levels": len(by_level),
        "jobs_by_level": [len(by_level[k]) for k in sorted(by_level)],
        "parts_not_succeeded": sum(r["state"] != "succeeded" for r in parts),
        "parts_run_again": sum(r["attempt"] > 1 for r in parts),
        "total_s": seconds(doc["created_at"], doc["finished_at"]),
        "to_first_chunk_start_s": seconds(doc["created_at"], min(r["started_at"] for r in chunks)),
        "map_s": span(chunks),
        "reduce_levels_s": [span(by_level[k]) for k in sorted(by_level) if k > 0],
        "last_end_to_document_end_s": seconds(
            max(r["finished_at"] for r in parts), doc["finished_at"]
        ),
        "chunk_s_median": sorted(seconds(r["started_at"], r["finished_at"]) for r in chunks)[
            len(chunks) // 2
        ],
    }


def assignment(bootstrap: str, group: str) -> dict[int, str]:
    """Dispatch partition -> the member holding it (its instance id, else its member id)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    described = admin.describe_consumer_groups([group])[group].result(timeout=10)
    out: dict[int, str] = {}
    for member in described.members:
        name = member.group_instance_id or member.member_id
        for tp in member.assignment.topic_partitions:
            out[tp.partition] = name
    return out


async def assignment_async(bootstrap: str, group: str) -> dict[int, str]:
    return await asyncio.to_thread(assignment, bootstrap, group)


def spread(
    chunks: Sequence[Mapping[str, Any]], held: Mapping[int, str]
) -> dict[str, list[Mapping[str, Any]]]:
    """The chunks by the worker that held their partition ("?" where none is known)."""
    out: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for c in chunks:
        out[held.get(c["dispatch_partition"], "?")].append(c)
    return out


async def roofline_s(
    inputs: Sequence[str], *, max_tokens: int, max_num_seqs: int, context: int
) -> float:
    """Simulated GPU seconds for one engine to summarize ``inputs`` given to it at once
    (the simulator at time scale 0: its roofline steps, no sleeping)."""
    if not inputs:
        return 0.0
    engine = SimEngine(time_scale=0.0, max_num_seqs=max_num_seqs, max_model_len=context)
    await engine.start()

    async def one(n: int, text: str) -> None:
        request = GenerationRequest(
            request_id=str(n), kind=JobKind.SUMMARIZE, input=text, max_tokens=max_tokens
        )
        async for _ in engine.generate(request):
            pass

    try:
        await asyncio.gather(*(one(n, text) for n, text in enumerate(inputs)))
    finally:
        await engine.close()
    return engine.simulated_s


async def ideal_map_s(
    chunks: Sequence[Mapping[str, Any]],
    held: Mapping[int, str],
    workers: int,
    **engine: int,
) -> dict[str, Any]:
    """The map's simulated GPU time (before the time scale) with the chunks spread as the
    partitions spread them, and evenly (chunk i on worker i mod n); the chunks per worker."""
    by_worker = spread(chunks, held) if workers > 1 else {"worker": list(chunks)}
    as_run = [await roofline_s([c["input"] for c in cs], **engine) for cs in by_worker.values()]
    even = [
        await roofline_s([c["input"] for c in chunks[k::workers]], **engine) for k in range(workers)
    ]
    counts = Counter({name: len(cs) for name, cs in by_worker.items()})
    return {
        "partitions_per_worker": sorted(Counter(held.values()).values(), reverse=True),
        "as_spread_s": round(max(as_run), 3),
        "even_s": round(max(even), 3),
        "one_worker_s": round(await roofline_s([c["input"] for c in chunks], **engine), 3),
        "chunks_per_worker": sorted(counts.values(), reverse=True),
        "workers_with_chunks": len(counts),
    }


@asynccontextmanager
async def servers(directory: Path) -> AsyncIterator[Servers]:
    """Embedded PostgreSQL (pg_stat_statements, room for 16 workers) and broker."""
    async with costs_servers(directory, max_connections=MAX_CONNECTIONS) as found:
        yield found


def document(tokens: int) -> str:
    """A structured document of about ``tokens`` simulator tokens."""
    words = tokens
    for _ in range(2):
        words = int(words * tokens / count_tokens(long_document(words)))
    return long_document(words)


def busy_s() -> float:
    """The machine's busy CPU seconds so far (every process's, this stack's or not)."""
    t = psutil.cpu_times()
    return float(t.user + t.nice + t.system + getattr(t, "irq", 0) + getattr(t, "softirq", 0))


def per_job(w: dict[str, Any], idle: dict[str, Any], jobs: int) -> dict[str, Any]:
    """Statements (all, and without BEGIN/COMMIT) and commits per job: gross, and net of
    the idle window's rate over the window's length."""
    out: dict[str, Any] = {}
    for key in PG_KEYS:
        rate = idle["pg"][f"pg.{key}"] / idle["window_s"]
        raw = w["pg"][f"pg.{key}"]
        out[key] = {
            "gross": round(raw / jobs, 3),
            "net_of_idle": round((raw - rate * w["window_s"]) / jobs, 3),
        }
    return out


def speedups(runs: list[dict[str, Any]]) -> None:
    """Each run's map speed-up against the one-worker run of its engine, measured and by
    the roofline for the chunks as they were spread."""
    for r in runs:
        base = next((b for b in runs if b["seqs"] == r["seqs"] and b["workers"] == 1), None)
        if base is None:
            continue
        r["map_speedup"] = round(base["map_s"] / r["map_s"], 2)
        r["map_speedup_per_worker"] = round(r["map_speedup"] / r["workers"], 3)
        roof = r["roofline_map_s"]
        r["roofline_speedup"] = round(roof["one_worker_s"] / roof["as_spread_s"], 2)
        r["roofline_speedup_even"] = round(roof["one_worker_s"] / roof["even_s"], 2)
