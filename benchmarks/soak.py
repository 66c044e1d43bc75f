"""Soak: the local stack as real processes under twice the engine's capacity for minutes.

``python -m sluicegate api``, ``relay``, ``worker`` (the simulator at ``--time-scale`` x its
roofline time) and ``webhooks`` run as separate processes, as a user starts them, on
embedded PostgreSQL and the embedded broker (or SLUICEGATE_BENCH_DATABASE_URL /
SLUICEGATE_BENCH_KAFKA). The engine's capacity on the overload benchmark's job mix is
measured first; then Poisson arrivals at ``--overload`` x that capacity are submitted over
HTTP for ``--minutes`` (admission as configured by default: block up to ``max_block_ms``,
then refuse; thresholds from Little's law as in the overload benchmark; a refusal is not
retried). Every job has a callback to a receiver in this process and a deadline far away,
so each accepted job must succeed once and be delivered once.

Every ``--sample-s`` seconds: each process's RSS and CPU, the submit p50/p99 and the
accepted and refused counts of that interval. After the load, a drain of up to
``--drain-s`` seconds; then jobs lost (accepted, not terminal: must be 0), jobs with more
than one terminal event in the outbox or on the events topic (must be 0), webhook
deliveries per job (one sequence each), and the end-to-end p50/p99 of the succeeded jobs.
Writes docs/bench/soak.json and soak.png (RSS over time).

Not part of ``python -m benchmarks`` (it runs only with ``--only soak``).

    python -m benchmarks.soak [--minutes 10] [--overload 2] [--minutes 1 for a smoke run]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from ipaddress import ip_network
from pathlib import Path
from typing import Any

import httpx
import psutil
from aiokafka import AIOKafkaConsumer, TopicPartition
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from benchmarks.harness import (
    OUT_DIR,
    TERMINAL,
    bench_settings,
    percentile,
    services,
    write_report,
)
from benchmarks.naive import Capacity, capacity
from benchmarks.overload import LAG_HARD_S, LAG_SOFT_S
from benchmarks.plot import plot_soak
from benchmarks.trace import Mix, backlog
from plumbing.db import make_engine
from plumbing.settings import Settings
from schemas import constants
from schemas.envelopes import JobEvent
from schemas.tables import jobs, outbox, webhook_deliveries
from sluicegate.local.embedded import free_port

OUT = OUT_DIR / "soak.json"
TENANT = "soak"
ROLES = ("api", "relay", "worker", "webhooks")
MAX_IN_FLIGHT = 512  # submits waiting for their answer; arrivals past it are not sent
MIB = 1024 * 1024


# --- the processes ------------------------------------------------------------------------


def environment(settings: Settings) -> dict[str, str]:
    """The variables that make ``Settings()`` in a process equal ``settings``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICEGATE_")}
    for name, value in settings.model_dump(mode="json", include=settings.model_fields_set).items():
        if value is not None:
            env[f"SLUICEGATE_{name.upper()}"] = (
                value if isinstance(value, str) else json.dumps(value)
            )
    env["PYTHONUNBUFFERED"] = "1"
    return env


@dataclass
class Stack:
    """The roles as processes, their logs in ``directory``."""

    settings: Settings
    directory: Path
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start(self) -> None:
        env = environment(self.settings)
        for role in ROLES:
            with open(self.directory / f"{role}.log", "wb") as log:
                self.processes[role] = subprocess.Popen(
                    [sys.executable, "-m", "sluicegate", role],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )

    def check(self) -> None:
        for role, process in self.processes.items():
            if process.poll() is not None:
                tail = (self.directory / f"{role}.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{role} exited with {process.returncode}:\n{tail}")

    def stop(self) -> dict[str, int | None]:
        """SIGTERM every role, SIGKILL what is still there after 30 s; the exit codes."""
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes.values():
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        return {role: p.returncode for role, p in self.processes.items()}

    def memory(self) -> tuple[dict[str, float], dict[str, float]]:
        """Each role's RSS (MiB) and CPU seconds so far (children included)."""
        rss, cpu = {}, {}
        for role, process in self.processes.items():
            with contextlib.suppress(psutil.Error):
                proc = psutil.Process(process.pid)
                family = [proc, *proc.children(recursive=True)]
                rss[role] = sum(p.memory_info().rss for p in family) / MIB
                cpu[role] = sum(sum(p.cpu_times()[:2]) for p in family)
        return rss, cpu


# --- the webhook receiver -----------------------------------------------------------------


@dataclass
class Receiver:
    """A plain HTTP server that answers 204 to every webhook and remembers what came."""

    port: int = field(default_factory=free_port)
    ids_by_job: defaultdict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    attempts: int = 0

    async def serve(self) -> asyncio.Server:
        return await asyncio.start_server(self._connection, "127.0.0.1", self.port)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError, ValueError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                headers = {}
                for line in head.decode("latin-1").split("\r\n")[1:]:
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                self.attempts += 1
                job = json.loads(body).get("data", {}).get("id", "?")
                self.ids_by_job[job].add(headers.get("webhook-id", "?"))
                writer.write(b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n")
                await writer.drain()
        writer.close()


# --- the load -----------------------------------------------------------------------------


@dataclass
class Answer:
    sent_s: float
    latency_s: float
    status: int
    reason: str | None = None
    job_id: str | None = None


@dataclass
class Load:
    answers: list[Answer] = field(default_factory=list)
    accepted: dict[str, float] = field(default_factory=dict)  # job id: when submitted
    not_sent: int = 0
    in_flight: int = 0


async def submit(
    client: httpx.AsyncClient, load: Load, body: dict[str, Any], started: float
) -> None:
    sent = time.monotonic()
    load.in_flight += 1
    try:
        r = await client.post("/v1/jobs", json=body)
    except httpx.HTTPError as exc:
        load.answers.append(Answer(sent - started, time.monotonic() - sent, 0, type(exc).__name__))
        return
    finally:
        load.in_flight -= 1
    answer = Answer(sent - started, time.monotonic() - sent, r.status_code)
    if r.status_code == 202:
        answer.job_id = r.json()["id"]
        load.accepted[answer.job_id] = sent
    else:
        with contextlib.suppress(ValueError):
            payload = r.json()
            answer.reason = payload.get("reason") or payload.get("error", {}).get("code")
    load.answers.append(answer)


async def offer(
    client: httpx.AsyncClient, load: Load, rate: float, seconds: float, callback: str
) -> None:
    """Poisson arrivals at ``rate`` for ``seconds``, each one submit (not retried)."""
    rng = random.Random(11)
    docs = backlog(400, Mix(), seed=13)
    tasks: set[asyncio.Task[None]] = set()
    started = time.monotonic()
    at = rng.expovariate(rate)
    index = 0
    while at < seconds:
        await asyncio.sleep(max(0.0, started + at - time.monotonic()))
        if load.in_flight >= MAX_IN_FLIGHT:
            load.not_sent += 1
        else:
            doc, max_tokens = docs[index % len(docs)]
            body = {
                "kind": "summarize",
                "input": doc,
                "max_tokens": max_tokens,
                "ttl_s": 3600,
                "callback_url": callback,
            }
            task = asyncio.create_task(submit(client, load, body, started))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        index += 1
        at += rng.expovariate(rate)
    await asyncio.gather(*tasks)


@dataclass
class Batches:
    accepted: dict[str, int] = field(default_factory=dict)  # batch id: its jobs
    refused: Counter[str] = field(default_factory=Counter)


async def offer_batches(
    client: httpx.AsyncClient,
    batches: Batches,
    doc: Callable[[int], tuple[str, int]],
    *,
    every_s: float,
    size: int,
    seconds: float,
    window: str = "1h",
    callback: str | None = None,
) -> None:
    """A batch of ``size`` lines every ``every_s`` for ``seconds``, the first at once; the
    k-th line offered summarizes ``doc(k)`` (a document and its max_tokens)."""
    started, n = time.monotonic(), 0
    while (at := n * every_s) < seconds:
        await asyncio.sleep(max(0.0, started + at - time.monotonic()))
        lines = []
        for i in range(size):
            text, max_tokens = doc(n * size + i)
            body = {"kind": "summarize", "input": text, "max_tokens": max_tokens}
            lines.append(
                {"custom_id": f"{n}-{i}", "method": "POST", "url": "/v1/jobs", "body": body}
            )
        request: dict[str, Any] = {"requests": lines, "completion_window": window}
        if callback is not None:
            request["callback_url"] = callback
        try:
            r = await client.post("/v1/batches", json=request)
        except httpx.HTTPError as exc:
            batches.refused[type(exc).__name__] += 1
        else:
            if r.status_code == 201:
                batches.accepted[r.json()["id"]] = size
            else:
                reason = None
                with contextlib.suppress(ValueError, AttributeError):
                    payload = r.json()
                    reason = payload.get("reason") or payload.get("error", {}).get("code")
                batches.refused[f"{r.status_code} {reason}"] += 1
        n += 1


# --- sampling -----------------------------------------------------------------------------


async def terminal_count(db: AsyncEngine) -> int:
    async with db.connect() as conn:
        query = select(func.count()).where(jobs.c.tenant == TENANT, jobs.c.state.in_(TERMINAL))
        return int((await conn.execute(query)).scalar_one())


async def sample(
    stack: Stack, load: Load, db: AsyncEngine, every_s: float, t0: float, out: list[dict[str, Any]]
) -> None:
    seen = 0
    cpu_before: dict[str, float] = {}
    last, own_cpu = time.monotonic(), time.process_time()
    while True:
        await asyncio.sleep(max(0.0, last + every_s - time.monotonic()))
        now = time.monotonic()
        rss, cpu = stack.memory()
        fresh = load.answers[seen:]
        seen += len(fresh)
        latencies = [a.latency_s * 1000 for a in fresh]
        span = now - last
        out.append(
            {
                "at_s": round(now - t0, 1),
                "rss_mb": {k: round(v, 1) for k, v in rss.items()},
                "cpu_share": {
                    k: round((v - cpu_before.get(k, v)) / span, 3) for k, v in cpu.items()
                },
                # This process (the load and the receiver): if it were busy, the submit
                # latencies would be its own.
                "load_generator_cpu_share": round((time.process_time() - own_cpu) / span, 3),
                "submits_in_flight": load.in_flight,
                "submit_p50_ms": round(percentile(latencies, 0.5), 2) if latencies else None,
                "submit_p99_ms": round(percentile(latencies, 0.99), 2) if latencies else None,
                "accepted_per_s": round(sum(a.status == 202 for a in fresh) / span, 2),
                "refused_per_s": round(sum(a.status in (429, 503) for a in fresh) / span, 2),
                "terminal": await terminal_count(db),
            }
        )
        cpu_before, last, own_cpu = cpu, now, time.process_time()
        stack.check()


# --- the checks at the end ----------------------------------------------------------------


async def drain(db: AsyncEngine, accepted: set[str], limit_s: float) -> float:
    """Wait until every accepted job is terminal, or ``limit_s``; the seconds it took."""
    started = time.monotonic()
    while time.monotonic() - started < limit_s:
        async with db.connect() as conn:
            rows = await conn.execute(
                select(jobs.c.id).where(jobs.c.tenant == TENANT, jobs.c.state.in_(TERMINAL))
            )
            done = {str(r.id) for r in rows}
        if accepted <= done:
            break
        await asyncio.sleep(2.0)
    return time.monotonic() - started


async def outcomes(db: AsyncEngine, settings: Settings, accepted: set[str]) -> dict[str, Any]:
    async with db.connect() as conn:
        rows = (
            await conn.execute(
                select(jobs.c.id, jobs.c.state, jobs.c.created_at, jobs.c.finished_at).where(
                    jobs.c.tenant == TENANT
                )
            )
        ).all()
        events = (
            await conn.execute(
                select(outbox.c.key, outbox.c.payload).where(
                    outbox.c.topic == settings.events_topic
                )
            )
        ).all()
        deliveries = Counter(
            str(s)
            for s in await conn.scalars(
                select(webhook_deliveries.c.subject).where(webhook_deliveries.c.tenant == TENANT)
            )
        )
    by_id = {str(r.id): r for r in rows}
    lost = sorted(j for j in accepted if j not in by_id or by_id[j].state not in TERMINAL)
    e2e = [
        (r.finished_at - r.created_at).total_seconds()
        for j, r in by_id.items()
        if j in accepted and r.state == "succeeded"
    ]
    ends = Counter(r.key for r in events if r.key in accepted and _terminal(r.payload))
    return {
        "accepted": len(accepted),
        "states": dict(Counter(by_id[j].state for j in accepted if j in by_id)),
        "lost": len(lost),
        "lost_ids": lost[:20],
        "duplicated_in_outbox": sum(1 for n in ends.values() if n > 1),
        "terminal_without_outbox_event": sum(
            1 for j in accepted if j in by_id and by_id[j].state in TERMINAL and ends[j] == 0
        ),
        "webhook_delivery_rows_over_one": sum(1 for n in deliveries.values() if n > 1),
        "webhook_delivery_rows": sum(deliveries.values()),
        "end_to_end_p50_s": round(percentile(e2e, 0.5), 2),
        "end_to_end_p99_s": round(percentile(e2e, 0.99), 2),
        "end_to_end_max_s": round(max(e2e, default=float("nan")), 2),
    }


def _terminal(payload: bytes) -> bool:
    try:
        event = JobEvent.model_validate_json(payload)
    except ValueError:
        return False  # a dispatch record
    return event.state.value in TERMINAL


async def events_on_topic(settings: Settings, accepted: set[str]) -> dict[str, int]:
    """Terminal events per job on the events topic, read from its start."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=settings.require_kafka(), enable_auto_commit=False
    )
    await consumer.start()
    try:
        count = settings.topic_partitions()[settings.events_topic]
        partitions = [TopicPartition(settings.events_topic, p) for p in range(count)]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        ends = await consumer.end_offsets(partitions)
        ends_by_job: Counter[str] = Counter()
        records = 0
        quiet_since = time.monotonic()
        # To the end offsets, then until nothing more comes for 3 s (the embedded broker's
        # reported end can trail the last batch).
        while time.monotonic() - quiet_since < 3.0:
            batch = await consumer.getmany(timeout_ms=500)
            got = [record for chunk in batch.values() for record in chunk]
            behind = [tp for tp in partitions if await consumer.position(tp) < ends[tp]]
            if got or behind:
                quiet_since = time.monotonic()
            for record in got:
                records += 1
                if record.value is not None and _terminal(record.value):
                    key = record.key.decode() if record.key else "?"
                    if key in accepted:
                        ends_by_job[key] += 1
    finally:
        await consumer.stop()
    return {
        "records": records,
        "jobs_with_terminal_event": len(ends_by_job),
        "duplicated_on_topic": sum(1 for n in ends_by_job.values() if n > 1),
    }


def memory_growth(samples: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per role: RSS at the start and end of the load (mean of its first and last tenth,
    after the first minute's warm-up when the run is long enough), peak, and growth."""
    out: dict[str, dict[str, float]] = {}
    steady = [s for s in samples if s["at_s"] >= 60] if samples[-1]["at_s"] > 180 else samples
    tenth = max(1, len(steady) // 10)
    for role in ROLES:
        values = [s["rss_mb"][role] for s in steady if role in s["rss_mb"]]
        if not values:
            continue
        first = sum(values[:tenth]) / len(values[:tenth])
        last = sum(values[-tenth:]) / len(values[-tenth:])
        out[role] = {
            "start_mb": round(first, 1),
            "end_mb": round(last, 1),
            "peak_mb": round(max(values), 1),
            "growth_mb": round(last - first, 1),
        }
    return out


# --- the run ------------------------------------------------------------------------------


async def warm_up(client: httpx.AsyncClient, count: int) -> None:
    """Jobs of another tenant, until they end: the worker has joined and measured speed."""
    ids = []
    for _ in range(count):
        r = await client.post(
            "/v1/jobs",
            json={"kind": "summarize", "input": "A short warm-up note. " * 40, "max_tokens": 64},
            headers={constants.HEADER_TENANT: "warmup"},
        )
        r.raise_for_status()
        ids.append(r.json()["id"])
    async with asyncio.timeout(180):
        for job_id in ids:
            while True:
                view = await client.get(
                    f"/v1/jobs/{job_id}",
                    params={"wait": 10},
                    headers={constants.HEADER_TENANT: "warmup"},
                )
                if view.json()["state"] in TERMINAL:
                    break


async def api_ready(client: httpx.AsyncClient, stack: Stack) -> None:
    async with asyncio.timeout(60):
        while True:
            stack.check()
            with contextlib.suppress(httpx.HTTPError):
                if (await client.get("/healthz")).status_code == 200:
                    return
            await asyncio.sleep(0.3)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    mix = Mix()
    print(f"measuring the engine's capacity (time scale {args.time_scale}) ...", flush=True)
    cap: Capacity = await capacity(
        mix,
        time_scale=args.time_scale,
        warm_s=args.capacity_warm_s,
        measure_s=args.capacity_measure_s,
    )
    rate = cap.jobs_per_s * args.overload
    print(f"capacity {cap.jobs_per_s:.2f} jobs/s; offering {rate:.2f} jobs/s", flush=True)
    receiver = Receiver()
    server = await receiver.serve()
    overrides: dict[str, object] = {
        "api_port": free_port(),
        "partitions": 4,
        "lag_soft": round(cap.jobs_per_s * (cap.service_p99_s + LAG_SOFT_S)),
        "lag_hard": round(cap.jobs_per_s * (cap.service_p99_s + LAG_HARD_S)),
        "max_block_ms": 1000,
        "expected_token_time_s": cap.decode_s_per_token,
        "deadline_aware": False,
        "retry_after_max_s": 10.0,
        "max_input_bytes": 1_000_000,
        "sim_time_scale": args.time_scale,
        "webhook_allow_networks": (ip_network("127.0.0.0/8"),),
        "webhook_retry_schedule_s": (0.0, 1.0, 5.0),
    }
    callback = f"http://127.0.0.1:{receiver.port}/hook"
    samples: list[dict[str, Any]] = []
    load = Load()
    with tempfile.TemporaryDirectory(prefix="sluicegate-soak-") as tmp:
        async with (
            services() as (admin, bootstrap),
            bench_settings(admin, bootstrap, data_dir=Path(tmp), **overrides) as settings,
        ):
            stack = Stack(settings, Path(tmp))
            db = make_engine(settings.require_database_url(), pool_size=2)
            limits = httpx.Limits(max_connections=MAX_IN_FLIGHT)
            base = f"http://127.0.0.1:{settings.api_port}"
            client = httpx.AsyncClient(
                base_url=base,
                headers={constants.HEADER_TENANT: TENANT},
                limits=limits,
                timeout=60.0,
            )
            try:
                stack.start()
                await api_ready(client, stack)
                (await client.post("/v1/webhooks/secrets")).raise_for_status()
                await warm_up(client, settings.speed_min_samples)
                print(f"stack up; {args.minutes} min of load", flush=True)
                t0 = time.monotonic()
                sampler = asyncio.create_task(sample(stack, load, db, args.sample_s, t0, samples))
                offering = asyncio.create_task(
                    offer(client, load, rate, args.minutes * 60, callback)
                )
                await asyncio.wait({offering, sampler}, return_when=asyncio.FIRST_COMPLETED)
                if sampler.done():  # a role died: stop the load and say why
                    offering.cancel()
                    await sampler
                await offering
                load_s = time.monotonic() - t0
                accepted = set(load.accepted)
                drained_s = await drain(db, accepted, args.drain_s)
                await asyncio.sleep(min(10.0, args.drain_s))  # webhook deliveries of the last
                sampler.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sampler
                ends = await outcomes(db, settings, accepted)
                topic = await events_on_topic(settings, accepted)
            finally:
                await client.aclose()
                exits = stack.stop()
                await db.dispose()
                server.close()
    refused = Counter(a.reason for a in load.answers if a.status in (429, 503))
    others = Counter(str(a.status) for a in load.answers if a.status not in (202, 429, 503))
    latencies = [a.latency_s * 1000 for a in load.answers]
    webhook_ids = receiver.ids_by_job
    report = {
        "config": {
            "minutes": args.minutes,
            "overload": args.overload,
            "time_scale": args.time_scale,
            "capacity_jobs_per_s": round(cap.jobs_per_s, 2),
            "offered_jobs_per_s": round(rate, 2),
            "sample_s": args.sample_s,
            "drain_limit_s": args.drain_s,
            "settings": {k: str(v) for k, v in overrides.items()},
            "processes": "python -m sluicegate api | relay | worker | webhooks",
        },
        "offered": len(load.answers) + load.not_sent,
        "not_sent_client_cap": load.not_sent,
        "accepted": len(load.accepted),
        "refused": sum(refused.values()),
        "refused_by_reason": dict(refused),
        "other_answers": dict(others),
        "submit_p50_ms": round(percentile(latencies, 0.5), 2),
        "submit_p99_ms": round(percentile(latencies, 0.99), 2),
        "load_s": round(load_s, 1),
        "drain_s": round(drained_s, 1),
        **ends,
        "events_topic": topic,
        "webhooks_received": receiver.attempts,
        "webhook_jobs_delivered": sum(1 for j in webhook_ids if j in load.accepted),
        "webhook_jobs_with_two_sequences": sum(
            1 for j, ids in webhook_ids.items() if j in load.accepted and len(ids) > 1
        ),
        "rss": memory_growth(samples),
        "exit_codes": exits,
        "samples": samples,
    }
    return report


def headline(report: dict[str, Any]) -> dict[str, Any]:
    rss = report["rss"]
    return {
        "lost (must be 0)": report["lost"],
        "duplicated, outbox / topic (must be 0)": (
            f"{report['duplicated_in_outbox']} / {report['events_topic']['duplicated_on_topic']}"
        ),
        "end-to-end p99 s": report["end_to_end_p99_s"],
        "submit p99 ms": report["submit_p99_ms"],
        "RSS growth MiB, api / worker": (
            f"{rss.get('api', {}).get('growth_mb')} / {rss.get('worker', {}).get('growth_mb')}"
        ),
    }


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="of load (1: a smoke run)")
    parser.add_argument("--overload", type=float, default=2.0, help="x the engine's capacity")
    parser.add_argument("--time-scale", type=float, default=4.0, help="x roofline step time")
    parser.add_argument("--sample-s", type=float, default=5.0)
    parser.add_argument("--drain-s", type=float, default=180.0, help="longest wait after load")
    parser.add_argument(
        "--capacity-warm-s", type=float, default=20.0, help="engine s before measuring capacity"
    )
    parser.add_argument(
        "--capacity-measure-s", type=float, default=30.0, help="engine s of capacity measured"
    )
    parser.add_argument(
        "--quick", action="store_true", help="a 1-minute smoke run; writes only with --out"
    )
    parser.add_argument("--out", type=Path, default=None, help="default docs/bench/soak.json")
    return parser


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parser().parse_args(argv)
    if args.quick:
        args.minutes, args.drain_s = min(args.minutes, 1.0), min(args.drain_s, 60.0)
        args.capacity_warm_s, args.capacity_measure_s = 8.0, 6.0
    logging.basicConfig(level=logging.WARNING)
    report = asyncio.run(run(args))
    shown = {k: v for k, v in report.items() if k not in ("samples", "config")}
    print(json.dumps(shown, indent=1))
    out = args.out or (None if args.quick else OUT)
    if out is not None:
        write_report(report, out, lambda png: plot_soak(report["samples"], path=png))
    if report["lost"] or report["duplicated_in_outbox"]:
        print("FAILED: jobs lost or duplicated", file=sys.stderr)
    return report


if __name__ == "__main__":
    main()
