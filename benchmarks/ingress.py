"""Ingress: how many jobs a second Sluicegate accepts, and how fast it answers a submit,
against the same machine's baseline: Celery's ``apply_async`` on the local Redis broker.

Sluicegate runs the way a user runs it: ``sluicegate api`` (uvicorn) and ``sluicegate
relay`` in subprocesses, on a new migrated database of embedded PostgreSQL, or of the server
at SLUICEGATE_BENCH_DATABASE_URL (a maintenance database URL, e.g.
postgresql://postgres@127.0.0.1:5432/postgres), and the embedded broker unless
SLUICEGATE_BENCH_KAFKA is set. The load comes over loopback HTTP from aiohttp clients
(closed loop: each client sends its next request when the last one is answered). Every
2xx means the job and its outbox row are committed; the relay publishes them meanwhile, and
the run ends by waiting for the outbox to drain. Admission stays on, with its thresholds
raised out of reach (no workers run, so the lag only grows): what is measured is the
accepting, not the refusing.

The baseline is Celery with Redis (CELERY_BENCH_REDIS_URL, default redis://127.0.0.1:6379/0):
``apply_async`` of a task taking the same payload from one thread and from ``--threads``
(the better of the two is the baseline; no Celery worker runs: it measures the enqueue), on
a queue of the run's own that is deleted after; and a ``group`` of as many signatures as a
Sluicegate batch has lines. ``cpu_ms_per_job``: CPU per accepted job of the API process
(Sluicegate) or of the calling process (Celery).

Scenarios: (a) single submits, POST /v1/jobs from many clients, and one client alone (the
unloaded latency); (b) batches, POST /v1/batches of ``--batch-size`` lines. Prints figures
and writes docs/bench/ingress.json and docs/bench/ingress.png. ``--quick`` runs a few
seconds and only prints (a smoke run), unless ``--out`` names a file.

Needs the ``bench`` extra: pip install -e '.[bench]' (celery, redis, aiohttp, matplotlib).
Run: python -m benchmarks.ingress [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import json
import os
import platform
import signal
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.harness import OUT_DIR, bench_settings, percentile, services, write_report
from client.samples import sample_documents
from plumbing.settings import Settings
from schemas.constants import M_SUBMIT_GROUP as SUBMIT_GROUP
from sluicegate.local.embedded import free_port

ROOT = Path(__file__).resolve().parents[1]
OUT = OUT_DIR / "ingress.json"
INSTALL = "pip install -e '.[bench]'  (celery, redis, aiohttp, matplotlib)"
TENANT = {"X-Sluicegate-Tenant": "bench", "Content-Type": "application/json"}
OUT_OF_REACH = 1_000_000_000
DRAIN_TIMEOUT_S = 300.0

# The same job for both: a document of about 3 KB to summarize.
DOCUMENT = sample_documents()[0][1]
JOB: dict[str, Any] = {"kind": "summarize", "input": DOCUMENT, "max_tokens": 256, "ttl_s": 3600}


def bench_modules() -> tuple[Any, Any, Any]:
    """celery, redis and aiohttp, or an exit that says what to install."""
    try:
        return tuple(importlib.import_module(m) for m in ("celery", "redis", "aiohttp"))  # type: ignore[return-value]
    except ImportError as exc:
        sys.exit(f"benchmarks.ingress needs the bench extra ({exc.name} is missing): {INSTALL}")


@dataclass
class Run:
    """One scenario's answers: latencies (s) of the accepted ones, statuses, elapsed time."""

    jobs_per_request: int
    latencies: list[float] = field(default_factory=list)
    statuses: Counter[int] = field(default_factory=Counter)
    elapsed_s: float = 0.0
    cpu_s: float = 0.0  # CPU time of the side that accepts (see the setup's line)
    client_cpu_s: float | None = None  # of the load generator (aiohttp), for Sluicegate
    groups: tuple[float, float] | None = None  # single submits: (jobs, statements) written

    def figures(self) -> dict[str, Any]:
        accepted = len(self.latencies)
        if not accepted:
            return {"jobs_per_s": 0.0, "statuses": {str(k): v for k, v in self.statuses.items()}}
        return {
            "requests_accepted": accepted,
            "jobs_accepted": accepted * self.jobs_per_request,
            "jobs_per_s": round(accepted * self.jobs_per_request / self.elapsed_s, 1),
            "requests_per_s": round(accepted / self.elapsed_s, 1),
            "p50_ms": round(percentile(self.latencies, 0.5) * 1000, 2),
            "p99_ms": round(percentile(self.latencies, 0.99) * 1000, 2),
            "statuses": {str(k): v for k, v in sorted(self.statuses.items())},
            "seconds": round(self.elapsed_s, 2),
            "cpu_ms_per_job": round(self.cpu_s * 1000 / (accepted * self.jobs_per_request), 3),
            **(
                {}
                if not self.groups or not self.groups[1]
                else {"mean_group_size": round(self.groups[0] / self.groups[1], 1)}
            ),
            **(
                {}
                if self.client_cpu_s is None
                else {
                    "client_cpu_ms_per_job": round(
                        self.client_cpu_s * 1000 / (accepted * self.jobs_per_request), 3
                    )
                }
            ),
        }


# --- Celery baseline --------------------------------------------------------------------


def celery_baseline(args: argparse.Namespace) -> dict[str, Any]:
    celery, redis, _ = bench_modules()
    url = os.environ.get("CELERY_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
    queue = f"sluicegate-bench-{uuid.uuid4().hex[:8]}"
    app = celery.Celery("sluicegate_bench", broker=url, set_as_current=False)
    app.conf.update(task_default_queue=queue, task_ignore_result=True, broker_pool_limit=64)

    @app.task(name="bench.summarize")  # type: ignore[untyped-decorator]
    def summarize(job: dict[str, Any]) -> None:  # never runs: only enqueued
        del job

    client = redis.Redis.from_url(url)
    try:
        durable = client.config_get("appendonly").get("appendonly") == "yes"
        summarize.apply_async(args=(JOB,))  # connect and declare the queue once

        def one() -> None:
            summarize.apply_async(args=(JOB,))

        def group() -> None:
            celery.group(summarize.s(JOB) for _ in range(args.batch_size)).apply_async()

        result = {
            "setup": f"Celery {celery.__version__}, Redis broker at {url.rsplit('@', 1)[-1]} "
            f"(appendonly {'yes' if durable else 'no'}), apply_async from threads, no worker; "
            "cpu_ms_per_job: of the calling process",
            "single_1_thread": threaded(one, 1, args.seconds, 1).figures(),
            f"single_{args.threads}_threads": threaded(
                one, args.threads, args.seconds, 1
            ).figures(),
            f"group_of_{args.batch_size}": threaded(
                group, 1, args.seconds, args.batch_size
            ).figures(),
        }
    finally:
        client.delete(queue)
        client.close()
    return result


def threaded(call: Callable[[], None], threads: int, seconds: float, jobs: int) -> Run:
    """``threads`` callers in a closed loop for ``seconds``."""
    run = Run(jobs_per_request=jobs)
    lock = threading.Lock()
    until = time.perf_counter() + seconds

    def caller() -> None:
        mine: list[float] = []
        while (started := time.perf_counter()) < until:
            call()
            mine.append(time.perf_counter() - started)
        with lock:
            run.latencies += mine

    began, cpu = time.perf_counter(), time.process_time()
    workers = [threading.Thread(target=caller) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    run.elapsed_s = time.perf_counter() - began
    run.cpu_s = time.process_time() - cpu
    run.statuses[200] = len(run.latencies)
    return run


# --- Sluicegate ---------------------------------------------------------------------------


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


@dataclass(frozen=True)
class Served:
    url: str
    api_pid: int

    def api_cpu_s(self) -> float:
        """User + system CPU seconds of the API process and its children (Linux /proc)."""
        tick, total = os.sysconf("SC_CLK_TCK"), 0.0
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if self.api_pid in (int(stat.parent.name), int(fields[1])):
                total += (int(fields[11]) + int(fields[12])) / tick
        return total


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


async def sluicegate_runs(args: argparse.Namespace) -> dict[str, Any]:
    overrides: dict[str, Any] = {"lag_soft": OUT_OF_REACH, "lag_hard": OUT_OF_REACH}
    async with (
        services() as (admin, bootstrap),
        bench_settings(admin, bootstrap, **overrides) as settings,
        served(settings, args.api_processes) as api,
    ):
        single, batch = json.dumps(JOB).encode(), batch_body(args.batch_size)
        await drive(api, "/v1/jobs", single, clients=args.clients, seconds=args.warmup, jobs=1)
        await drive(api, "/v1/batches", batch, clients=1, seconds=args.warmup, jobs=1)
        runs = {
            f"single_{args.clients}_clients": await drive(
                api, "/v1/jobs", single, clients=args.clients, seconds=args.seconds, jobs=1
            ),
            "single_1_client": await drive(
                api, "/v1/jobs", single, clients=1, seconds=args.alone_seconds, jobs=1
            ),
            f"batches_of_{args.batch_size}_{args.batch_clients}_clients": await drive(
                api,
                "/v1/batches",
                batch,
                clients=args.batch_clients,
                seconds=args.seconds,
                jobs=args.batch_size,
            ),
        }
        drained = await outbox_drained(settings, DRAIN_TIMEOUT_S)
        facts = await database_facts(settings)
    where = "embedded" if "SLUICEGATE_BENCH_DATABASE_URL" not in os.environ else "local server"
    return {
        "setup": f"`sluicegate api --workers {args.api_processes}` (uvicorn) and `sluicegate "
        f"relay` in subprocesses, {where} PostgreSQL {facts['postgres']} (fsync "
        f"{facts['fsync']}, synchronous_commit {facts['synchronous_commit']}), aiohttp "
        "clients over loopback HTTP, closed loop; cpu_ms_per_job: of the API process(es)",
        **{name: run.figures() for name, run in runs.items()},
        "relay": drained,
    }


def report(args: argparse.Namespace, celery: dict[str, Any], sg: dict[str, Any]) -> dict[str, Any]:
    sg_single = sg[f"single_{args.clients}_clients"]
    sg_batch = sg[f"batches_of_{args.batch_size}_{args.batch_clients}_clients"]
    threads = (
        1
        if celery["single_1_thread"]["jobs_per_s"]
        >= celery[f"single_{args.threads}_threads"]["jobs_per_s"]
        else args.threads
    )
    celery_single = celery[f"single_{threads}_thread{'s' if threads > 1 else ''}"]
    celery_group = celery[f"group_of_{args.batch_size}"]
    single_ratio = sg_single["jobs_per_s"] / celery_single["jobs_per_s"]
    return {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}",
        "payload": f"a {len(DOCUMENT.encode())}-byte document to summarize, max_tokens 256",
        # Throughput: each side at its best (Celery: the better of 1 and --threads callers).
        "compared": {
            f"Celery apply_async, {threads} thread{'s' if threads > 1 else ''}": celery_single,
            f"Sluicegate POST /v1/jobs, {args.clients} clients": sg_single,
            f"Celery group of {args.batch_size}": celery_group,
            f"Sluicegate POST /v1/batches of {args.batch_size}": sg_batch,
        },
        # Latency: one caller alone, then loaded.
        "latency": {
            "Celery apply_async, 1 thread": celery["single_1_thread"],
            "Sluicegate POST /v1/jobs, 1 client": sg["single_1_client"],
            f"Sluicegate POST /v1/jobs, {args.clients} clients": sg_single,
            f"Celery group of {args.batch_size}": celery_group,
            f"Sluicegate POST /v1/batches of {args.batch_size}": sg_batch,
        },
        "sluicegate": sg,
        "celery": celery,
        "ratios": {
            "single_submit_jobs_per_s_sluicegate_over_celery": round(single_ratio, 2),
            "batch_jobs_per_s_sluicegate_over_celery_group": round(
                sg_batch["jobs_per_s"] / celery_group["jobs_per_s"], 2
            ),
            "batch_jobs_per_s_sluicegate_over_celery_single": round(
                sg_batch["jobs_per_s"] / celery_single["jobs_per_s"], 2
            ),
        },
        "targets": {
            "single_submit_ratio_at_least_1": single_ratio >= 1.0,
            "batches_at_least_5000_jobs_per_s": sg_batch["jobs_per_s"] >= 5000,
        },
    }


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few seconds")
    parser.add_argument("--seconds", type=float, default=10.0, help="each loaded scenario")
    parser.add_argument("--alone-seconds", type=float, default=5.0, help="the one-client run")
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--clients", type=int, default=64, help="concurrent single submitters")
    parser.add_argument("--threads", type=int, default=8, help="concurrent Celery callers")
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--batch-clients", type=int, default=4)
    parser.add_argument("--api-processes", type=int, default=1, help="sluicegate api --workers")
    parser.add_argument("--out", type=Path, default=None, help="default docs/bench/ingress.json")
    parser.add_argument("--no-plot", action="store_true")
    return parser


def headline(result: dict[str, Any]) -> dict[str, Any]:
    figures = {}
    for name, row in result["compared"].items():
        figures[f"{name}: jobs/s, p50 / p99 ms"] = (
            f"{row['jobs_per_s']:.0f}, {row.get('p50_ms')} / {row.get('p99_ms')}"
        )
    ratios = result["ratios"]
    figures["single submits, Sluicegate / Celery"] = ratios[
        "single_submit_jobs_per_s_sluicegate_over_celery"
    ]
    figures["batches, Sluicegate / Celery group"] = ratios[
        "batch_jobs_per_s_sluicegate_over_celery_group"
    ]
    return figures


def _plot(result: dict[str, Any], png: Path) -> None:
    from benchmarks.plot import plot_ingress  # the plots extra is optional here

    plot_ingress(result, path=png)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parser().parse_args(argv)
    if args.quick:
        args.seconds, args.alone_seconds, args.warmup, args.batch_clients = 2.0, 1.0, 0.5, 2
    out = args.out or (None if args.quick else OUT)
    bench_modules()
    celery = celery_baseline(args)
    sg = asyncio.run(sluicegate_runs(args))
    result = report(args, celery, sg)
    for figure, value in headline(result).items():
        print(f"{figure}: {value}")
    print(f"targets: {result['targets']}")
    if out is not None:
        write_report(result, out, None if args.no_plot else lambda png: _plot(result, png))
    return result


if __name__ == "__main__":
    main()
