"""The retention benchmark's run: the rates offered (from the engine's measured capacity, or
``--rate``), the stack's settings with short retention windows, the stack loaded while the
sampler runs, the drain after it, and the report of it all."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import random
import re
import time
from collections import Counter
from dataclasses import dataclass
from ipaddress import ip_network
from pathlib import Path
from typing import Any

import asyncpg
import httpx

from benchmarks.lib.engine import LAG_HARD_S, LAG_SOFT_S, capacity
from benchmarks.lib.offer import Batches, Load, offer, offer_batches
from benchmarks.lib.processes import Stack, api_ready, warm_up
from benchmarks.lib.receivers import FailingReceiver
from benchmarks.lib.retention.database import SETTINGS_SQL, storage
from benchmarks.lib.retention.figures import autovacuum, growth, rates, steady_rows
from benchmarks.lib.retention.sampler import Sampler
from benchmarks.lib.stack import TERMINAL
from benchmarks.lib.trace import Mix, backlog
from plumbing.db import libpq_url
from plumbing.settings import Settings
from schemas import constants
from sluicegate.local.embedded import free_port

TENANT = "retention"


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
    receiver: FailingReceiver, wanted: set[str], limit_s: float
) -> tuple[float, set[str]]:
    """Until the receiver has heard of every one of ``wanted``, or ``limit_s``."""
    started = time.monotonic()
    for _ in range(math.ceil(limit_s)):
        if wanted <= receiver.subjects:
            break
        await asyncio.sleep(1.0)
    return time.monotonic() - started, wanted - receiver.subjects


@dataclass(frozen=True)
class Rates:
    """The engine's capacity (measured, or from ``--rate`` / ``--load``) and the rates offered."""

    jobs_per_s: float
    service_p99_s: float
    token_s: float | None
    single_per_s: float
    batch_per_s: float


async def measure_rates(args: argparse.Namespace) -> Rates:
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
    return Rates(jobs_per_s, service_p99_s, token_s, rate, batch_rate)


def overrides(args: argparse.Namespace, plan: Rates) -> dict[str, object]:
    """The stack's settings: admission from the capacity, webhooks to this process retried
    quickly, the retention windows and pruning of the arguments."""
    jobs_per_s, service_p99_s = plan.jobs_per_s, plan.service_p99_s
    out: dict[str, object] = {
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
    if plan.token_s is not None:
        out["expected_token_time_s"] = plan.token_s
    return out


@dataclass
class Found:
    """What the loaded stack gave: the load's answers, the samples and the checks after."""

    pg: dict[str, tuple[str, str | None]]
    load: Load
    batches: Batches
    samples: list[dict[str, Any]]
    load_s: float
    pages: dict[str, Any]
    drained_s: float
    missing: set[str]
    unended_left: int
    exits: dict[str, int | None]


def loads(
    client: httpx.AsyncClient,
    args: argparse.Namespace,
    found: tuple[Load, Batches],
    rate: float,
    callback: str,
) -> list[asyncio.Task[None]]:
    """The single submits at ``rate`` and, every ``--batch-every-s``, a batch, as tasks."""
    load, batches = found
    rng, docs = random.Random(17), backlog(200, Mix(), seed=19)  # the batches' documents
    seconds = args.minutes * 60
    tasks = [asyncio.create_task(offer(client, load, rate, seconds, callback))]
    if args.batch_every_s > 0:
        tasks.append(
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
    return tasks


async def loaded(
    args: argparse.Namespace,
    settings: Settings,
    directory: Path,
    receiver: FailingReceiver,
    rate: float,
) -> Found:
    """The processes up, ``--minutes`` of load while the sampler runs, then the drain."""
    stack = Stack(settings, directory, relay_metrics_port=free_port())
    url = libpq_url(settings.require_database_url())
    client = httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{settings.api_port}",
        headers={constants.HEADER_TENANT: TENANT},
        limits=httpx.Limits(max_connections=512),
        timeout=60.0,
    )
    load, batches = Load(), Batches()
    conn = await asyncpg.connect(url)
    try:
        pg = {r["name"]: (r["setting"], r["unit"]) for r in await conn.fetch(SETTINGS_SQL)}
        stack.start()
        await api_ready(client, stack)
        (await client.post("/v1/webhooks/secrets")).raise_for_status()
        await warm_up(client, settings.speed_min_samples)
        print(
            f"stack up; {args.minutes} min of load, window reached at {window_s(args):.0f} s",
            flush=True,
        )
        t0 = time.monotonic()
        sampler = Sampler(stack, url, load, batches, receiver, args.sample_s, t0)
        sampling = asyncio.create_task(sampler.run())
        callback = f"http://127.0.0.1:{receiver.port}/hook"
        loading = asyncio.gather(*loads(client, args, (load, batches), rate, callback))
        either: set[asyncio.Future[Any]] = {loading, sampling}
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        if sampling.done():  # a role died, or sampling failed: say why
            loading.cancel()
            await sampling
        await loading
        load_s = time.monotonic() - t0
        await asyncio.sleep(max(0.0, t0 + args.minutes * 60 + args.sample_s - time.monotonic()))
        sampling.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampling
        pages = await storage(conn)  # as the load ends, before the drain
        wanted = set(load.accepted) | set(batches.accepted)
        print(f"load done; waiting for {len(wanted)} webhooks ...", flush=True)
        drained_s, missing = await wait_delivered(receiver, wanted, args.drain_s)
        # Jobs that reached the receiver but whose rows are gone are the pruner's work; jobs
        # still stored and not ended would be lost work.
        unended_left = await conn.fetchval(
            "SELECT count(*) FROM jobs WHERE tenant = $1 AND state::text <> ALL($2)",
            TENANT,
            sorted(TERMINAL),
        )
    finally:
        await conn.close()
        await client.aclose()
        exits = stack.stop()
    return Found(
        pg, load, batches, sampler.samples, load_s, pages, drained_s, missing, unended_left, exits
    )


def config(
    args: argparse.Namespace, plan: Rates, settings: dict[str, object], found: Found
) -> dict[str, Any]:
    return {
        "minutes": args.minutes,
        "time_scale": args.time_scale,
        "capacity_jobs_per_s": round(plan.jobs_per_s, 2),
        "capacity": "measured" if args.rate is None else "from --rate / --load",
        "load_share_of_capacity": args.load,
        "single_jobs_offered_per_s": round(plan.single_per_s, 2),
        "batch_jobs_offered_per_s": round(plan.batch_per_s, 2),
        "batch_size": args.batch_size,
        "batch_every_s": args.batch_every_s,
        "batch_window": args.batch_window,
        "fail_share": args.fail_share,
        "retention_outbox_s": args.outbox_s,
        "retention_ended_s": args.ended_s,
        "prune_interval_s": args.prune_interval_s,
        "prune_batch_rows": args.prune_batch_rows,
        "window_reached_s": window_s(args),
        "sample_s": args.sample_s,
        "postgres": {k: f"{v}{'' if u is None else ' ' + u}" for k, (v, u) in found.pg.items()},
        "settings": {k: str(v) for k, v in settings.items()},
        "processes": "python -m sluicegate api | relay | worker | webhooks",
    }


def load_figures(found: Found) -> dict[str, Any]:
    load, batches, load_s = found.load, found.batches, found.load_s
    answers = Counter(str(a.status) for a in load.answers)
    return {
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
        "unfinished_jobs_max": max((s["unfinished_jobs"] for s in found.samples), default=0),
    }


def summarize(
    args: argparse.Namespace,
    plan: Rates,
    settings: dict[str, object],
    found: Found,
    receiver: FailingReceiver,
) -> dict[str, Any]:
    samples, window = found.samples, window_s(args)
    grew, steady = growth(samples, window, found.load_s)
    return {
        "config": config(args, plan, settings, found),
        "load": load_figures(found),
        "growth_after_window": grew,
        "steady_rows": steady_rows(steady),
        "rates_steady": rates(steady),
        "autovacuum": autovacuum(samples, window),
        "storage_at_load_end": found.pages,
        "end": {
            "webhook_attempts_received": receiver.attempts,
            "webhook_attempts_refused": receiver.refused,
            "subjects_never_delivered": len(found.missing),
            "subjects_never_delivered_ids": sorted(found.missing)[:20],
            "drain_s": round(found.drained_s, 1),
            "unended_jobs_left": int(found.unended_left),
            "exit_codes": found.exits,
        },
        "samples": samples,
    }
