"""Long documents at scale: a 1,000-page document summarized as one job on 1, 4 and 16
simulated workers (an 8k-context model), its map's speed-up, and what its chunks cost
PostgreSQL against the same chunks submitted as plain jobs, on the stack as processes.

What it measures and how: docs/benchmarks.md#graphs. Not part of ``python -m benchmarks``
(it runs only with ``--only graphs``).

    flock /tmp/bench.lock python -m benchmarks.scenarios.graphs [--workers 1 4 16]
        [--seqs 1 256] [--time-scale 2 10] [--pages 1000] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

from benchmarks.lib.costs.observer import Observer, observer, pg_mark, pg_window, shorten
from benchmarks.lib.costs.windows import Pids, Servers, cpu_now
from benchmarks.lib.graphs import (
    TENANT_ROWS,
    TOKENS_PER_PAGE,
    assignment_async,
    busy_s,
    document,
    graph_rows,
    ideal_map_s,
    per_job,
    servers,
    span,
    speedups,
    timeline,
)
from benchmarks.lib.processes import Stack, api_ready, warm_up
from benchmarks.lib.reports import OUT_DIR, columns, write_report
from benchmarks.lib.stack import TERMINAL, bench_settings
from schemas import constants
from sluicegate.local.embedded import free_port
from workers.engines.sim.tokens import count_tokens

OUT = OUT_DIR / "graphs.json"
TTL_S = 4 * 3600.0
OWN = ("cpu_ms.observer_backend", "cpu_ms.load_generator")  # the benchmark's own CPU


class Run:
    """One stack of ``workers`` workers: its processes, its database's observer, a client."""

    def __init__(self, srv: Servers, stack: Stack, obs: Observer, args: argparse.Namespace) -> None:
        self.srv, self.stack, self.obs, self.args = srv, stack, obs, args
        self.client = httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{stack.settings.api_port}",
            limits=httpx.Limits(max_connections=64),
            timeout=120.0,
        )

    def pids(self) -> Pids:
        return Pids(
            roles={role: p.pid for role, p in self.stack.processes.items()},
            postmaster=self.srv.postmaster_pid(),
            broker=self.srv.broker.pid or 0,
            observer_backend=self.obs.backend_pid,
        )

    async def submit(self, tenant: str, text: str) -> str:
        body = {"kind": "summarize", "input": text, "max_tokens": self.args.max_tokens}
        r = await self.client.post(
            "/v1/jobs", json={**body, "ttl_s": TTL_S}, headers={constants.HEADER_TENANT: tenant}
        )
        r.raise_for_status()
        return str(r.json()["id"])

    async def ended(self, tenant: str, jobs: int) -> None:
        """Until ``jobs`` of ``tenant`` are terminal and the outbox is published."""
        terminal = sorted(TERMINAL)
        while True:
            self.stack.check()
            done = await self.obs.fetchval(
                "SELECT count(*) FROM jobs WHERE tenant = $1 AND parent_id IS NULL "
                "AND state = ANY($2::text[])",
                tenant,
                terminal,
            )
            if done >= jobs:
                left = await self.obs.fetchval(
                    "SELECT count(*) FROM outbox WHERE published_at IS NULL"
                )
                if left == 0:
                    return
            await asyncio.sleep(0.5)


async def window(run: Run, load: Callable[[], Awaitable[int]]) -> dict[str, Any]:
    """Counters before, the load (it returns its jobs once they ended), the settle, after."""
    await run.obs.fetchval("SELECT pg_stat_statements_reset()")
    pg_start, pids = await pg_mark(run.obs), run.pids()
    cpu_start, machine, t0 = cpu_now(pids), busy_s(), time.monotonic()
    jobs = await load()
    await asyncio.sleep(run.args.settle_s)
    cpu_end, machine, t1 = cpu_now(pids), busy_s() - machine, time.monotonic()
    pg, statements = await pg_window(run.obs, pg_start)
    cpu = {k: cpu_end[k] - cpu_start[k] for k in cpu_start}
    stack_ms = sum(v for k, v in cpu.items() if k not in OWN)
    cores = os.cpu_count() or 1
    return {
        "jobs": jobs,
        "window_s": round(t1 - t0, 2),
        "pg": pg,
        "cpu_ms": {k: round(v, 1) for k, v in cpu.items()},
        "stack_cpu_share": round(stack_ms / 1000 / ((t1 - t0) * cores), 3),
        "machine_busy_share": round(machine / ((t1 - t0) * cores), 3),
        "top_statements": [
            {"calls": int(s["calls"]), "query": shorten(s["query"], 140)}
            for s in sorted(statements, key=lambda s: -int(s["calls"]))[:14]
        ],
    }


async def idle_window(run: Run) -> dict[str, Any]:
    async def load() -> int:
        await asyncio.sleep(run.args.idle_s)
        return 0

    w = await window(run, load)
    workers = [v for k, v in w["cpu_ms"].items() if k.startswith("cpu_ms.worker")]
    w["worker_cpu_share_each"] = round(sum(workers) / 1000 / len(workers) / w["window_s"], 4)
    return w


async def graph_window(run: Run, text: str, tenant: str) -> tuple[dict[str, Any], str]:
    found: list[str] = []

    async def load() -> int:
        found.append(await run.submit(tenant, text))
        await run.ended(tenant, 1)
        return 1

    return await window(run, load), found[0]


async def chunks_window(
    run: Run, inputs: list[str], tenant: str
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The document's chunks as independent jobs, submitted together (16 at a time)."""
    gate = asyncio.Semaphore(16)

    async def one(text: str) -> str:
        async with gate:
            return await run.submit(tenant, text)

    async def load() -> int:
        await asyncio.gather(*(one(t) for t in inputs))
        await run.ended(tenant, len(inputs))
        return len(inputs)

    w = await window(run, load)
    rows = [dict(r) for r in await run.obs.fetch(TENANT_ROWS, tenant)]
    w["succeeded"] = sum(r["state"] == "succeeded" for r in rows)
    w["span_s"] = span(rows)
    return w, rows


async def started(run: Run) -> None:
    """The API answering: 16 workers and the other roles import at once on 2 cores, which
    can take longer than one ``api_ready``'s minute."""
    for _ in range(4):
        with contextlib.suppress(TimeoutError):
            await api_ready(run.client, run.stack)
            return
    raise TimeoutError("the API did not answer in 4 minutes")


def overrides(args: argparse.Namespace, seqs: int) -> dict[str, object]:
    return {
        "api_port": free_port(),
        "partitions": max(args.workers),
        "sim_time_scale": args.time_scale[args.seqs.index(seqs)],
        "sim_max_model_len": args.context,
        "sim_max_num_seqs": seqs,
        "max_input_bytes": 8 * 1_048_576,
        "max_body_bytes": 16 * 1_048_576,
        "deadline_aware": False,  # the figures are the run's, not the admission's
        "worker_db_pool_size": 4,
        "retention_outbox_s": 7 * 86_400.0,
        "retention_ended_s": 7 * 86_400.0,
    }


async def one_stack(
    srv: Servers, directory: Path, args: argparse.Namespace, text: str, seqs: int, workers: int
) -> dict[str, Any]:
    """The document on a fresh stack of ``workers``; with ``--compare``, its chunks as
    plain jobs after it, on the same stack."""
    print(f"{workers} workers, {seqs} sequences an engine ...", flush=True)
    async with bench_settings(
        srv.admin_url, srv.bootstrap, data_dir=directory, **overrides(args, seqs)
    ) as settings:
        stack = Stack(settings, directory, workers=workers)
        obs = await observer(srv.admin_url, settings.require_database_url())
        run = Run(srv, stack, obs, args)
        try:
            stack.start()
            await started(run)
            await warm_up(run.client, max(4, 2 * workers))
            await asyncio.sleep(args.settle_s)
            idle = await idle_window(run)
            doc, doc_id = await graph_window(run, text, f"doc-{workers}-{seqs}")
            held = await assignment_async(srv.bootstrap, settings.consumer_group)
            rows = await graph_rows(obs, doc_id)
            chunks = [r for r in rows[1:] if r["level"] == 0]
            plain: dict[str, Any] | None = None
            plain_rows: list[dict[str, Any]] = []
            if args.compare and workers == max(args.workers):
                inputs = [str(c["input"]) for c in chunks]
                plain, plain_rows = await chunks_window(run, inputs, f"plain-{workers}-{seqs}")
        finally:
            await run.client.aclose()
            await obs.conn.close()
            exits = stack.stop()
    engine = {"max_tokens": args.max_tokens, "max_num_seqs": seqs, "context": args.context}
    ideal = await ideal_map_s(chunks, held, workers, **engine)
    graph = timeline(rows)
    scale = args.time_scale[args.seqs.index(seqs)]
    out: dict[str, Any] = {
        "seqs": seqs,
        "workers": workers,
        **graph,
        "roofline_map_s": {k: v for k, v in ideal.items() if k.endswith("_s")},
        "chunks_per_worker": ideal["chunks_per_worker"],
        "partitions_per_worker": ideal["partitions_per_worker"],
        "time_scale": scale,
        "engine_pace": round(ideal["as_spread_s"] * scale / graph["map_s"], 3),
        "idle": idle,
        "document": doc,
        "per_chunk": per_job(doc, idle, graph["chunks"]),
        "exit_codes": exits,
    }
    if plain is not None:
        roof = await ideal_map_s(plain_rows, held, workers, **engine)
        plain["roofline_map_s"] = roof["as_spread_s"]
        plain["chunks_per_worker"] = roof["chunks_per_worker"]
        plain["engine_pace"] = round(roof["as_spread_s"] * scale / plain["span_s"], 3)
        out["plain"] = plain
        out["per_plain_job"] = per_job(plain, idle, plain["jobs"])
    return out


async def run(args: argparse.Namespace) -> dict[str, Any]:
    text = document(args.pages * TOKENS_PER_PAGE)
    runs = []
    with tempfile.TemporaryDirectory(prefix="sluicegate-graphs-") as tmp:
        async with servers(Path(tmp)) as srv:
            for seqs in args.seqs:
                for workers in args.workers:
                    runs.append(await one_stack(srv, Path(tmp), args, text, seqs, workers))
                    print(line(runs[-1]), flush=True)
    speedups(runs)
    config = {
        k: getattr(args, k)
        for k in ("pages", "workers", "seqs", "time_scale", "context", "max_tokens", "compare")
    }
    config["document_tokens"] = count_tokens(text)
    config["document_bytes"] = len(text.encode())
    return {"config": config, "runs": runs, "cpus": os.cpu_count()}


def line(r: dict[str, Any]) -> str:
    return (
        f"  {r['state']}: {r['chunks']} chunks, {r['levels']} levels, total {r['total_s']} s, "
        f"map {r['map_s']} s (roofline {r['roofline_map_s']['as_spread_s']} s x scale), "
        f"chunks per worker {r['chunks_per_worker']}, stack CPU share "
        f"{r['document']['stack_cpu_share']}"
    )


HEAD = "seqs scale workers chunks levels total_s map_s speed-up roofline pace stmts commits"


def show(report: dict[str, Any]) -> None:
    """The runs as a table (statements and commits a chunk, net of idle), and each
    comparison with the chunks as plain jobs."""
    rows = [HEAD.split()]
    for r in report["runs"]:
        pc = r["per_chunk"]
        figures = (
            *(r[k] for k in ("seqs", "time_scale", "workers", "chunks", "levels")),
            *(r[k] for k in ("total_s", "map_s")),
            *(r.get(k, "") for k in ("map_speedup", "roofline_speedup")),
            r["engine_pace"],
            pc["statements"]["net_of_idle"],
            pc["transactions"]["net_of_idle"],
        )
        rows.append([str(f) for f in figures])
    print(columns(rows))
    for r in report["runs"]:
        if "plain" in r:
            p, pj = r["plain"], r["per_plain_job"]
            print(
                f"{r['workers']} workers, {r['seqs']} seqs: the chunks as {p['jobs']} plain jobs: "
                f"span {p['span_s']} s, pace {p['engine_pace']} (the graph's map {r['map_s']} s, "
                f"pace {r['engine_pace']}); statements {pj['statements']['net_of_idle']} and "
                f"commits {pj['transactions']['net_of_idle']} a job (net of idle)"
            )


def headline(report: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for r in report["runs"]:
        if "map_speedup" in r and r["workers"] > 1:
            out[f"map speed-up, {r['workers']} workers, {r['seqs']} seqs"] = r["map_speedup"]
    return out


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--pages", type=int, default=1000, help="of 500 simulator tokens")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument(
        "--seqs", type=int, nargs="+", default=[1, 256], help="sequences an engine decodes"
    )
    parser.add_argument(
        "--time-scale",
        type=float,
        nargs="+",
        default=[2.0, 10.0],
        help="the simulator's, one for each of --seqs (or one for all)",
    )
    parser.add_argument("--context", type=int, default=8192, help="sim_max_model_len")
    parser.add_argument("--max-tokens", type=int, default=256, help="of the document")
    parser.add_argument("--idle-s", type=float, default=20.0, help="the idle window")
    parser.add_argument("--settle-s", type=float, default=11.0, help="after a window's drain")
    parser.add_argument(
        "--no-compare", dest="compare", action="store_false", help="no plain-job window"
    )
    parser.add_argument("--quick", action="store_true", help="30 pages on 1 and 2 workers")
    parser.add_argument("--out", type=Path, default=None, help="default docs/bench/graphs.json")
    return parser


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parser().parse_args(argv)
    if args.quick:
        args.pages, args.workers, args.seqs, args.time_scale = 30, [1, 2], [1], [0.2]
        args.idle_s, args.settle_s = 3.0, 2.0
    if len(args.time_scale) == 1:
        args.time_scale *= len(args.seqs)
    if len(args.time_scale) != len(args.seqs):
        raise SystemExit("--time-scale: one for each of --seqs, or one for all")
    logging.basicConfig(level=logging.WARNING)
    report = asyncio.run(run(args))
    show(report)
    out = args.out or (None if args.quick else OUT)
    if out is not None:
        write_report(report, out)
    return report


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
