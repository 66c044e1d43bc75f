"""Soak: the local stack as real processes under twice the engine's capacity for minutes.

What it measures and how: docs/benchmarks.md#soak. Not part of ``python -m benchmarks``
(it runs only with ``--only soak``).

    python -m benchmarks.scenarios.soak [--minutes 10] [--overload 2] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import sys
import tempfile
import time
from collections import Counter
from ipaddress import ip_network
from pathlib import Path
from typing import Any

import httpx

from benchmarks.lib.engine import LAG_HARD_S, LAG_SOFT_S, Capacity, capacity
from benchmarks.lib.offer import MAX_IN_FLIGHT, Load, offer
from benchmarks.lib.plots.soak import plot_soak
from benchmarks.lib.processes import Stack, api_ready, warm_up
from benchmarks.lib.receivers import Receiver
from benchmarks.lib.reports import OUT_DIR, percentile, write_report
from benchmarks.lib.stack import bench_settings, services
from benchmarks.lib.topics import events_on_topic
from benchmarks.lib.trace import Mix
from benchmarks.lib.watch import TENANT, drain, memory_growth, outcomes, sample
from plumbing.db import make_engine
from plumbing.settings import Settings
from schemas import constants
from sluicegate.local.embedded import free_port

OUT = OUT_DIR / "soak.json"


def overrides(args: argparse.Namespace, cap: Capacity) -> dict[str, object]:
    """The stack's settings: admission from Little's law as in the overload benchmark, a
    webhook to this process allowed and retried quickly."""
    return {
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


async def loaded(
    args: argparse.Namespace,
    settings: Settings,
    directory: Path,
    offered: tuple[float, str],
    load: Load,
    samples: list[dict[str, Any]],
) -> dict[str, Any]:
    """The processes up, ``offered`` (rate, callback) for ``--minutes``, the drain and the
    checks at the end; what they found."""
    rate, callback = offered
    stack = Stack(settings, directory)
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
        offering = asyncio.create_task(offer(client, load, rate, args.minutes * 60, callback))
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
    return {"load_s": load_s, "drained_s": drained_s, "ends": ends, "topic": topic, "exits": exits}


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
    settings_over = overrides(args, cap)
    callback = f"http://127.0.0.1:{receiver.port}/hook"
    samples: list[dict[str, Any]] = []
    load = Load()
    with tempfile.TemporaryDirectory(prefix="sluicegate-soak-") as tmp:
        async with (
            services() as (admin, bootstrap),
            bench_settings(admin, bootstrap, data_dir=Path(tmp), **settings_over) as settings,
        ):
            try:
                found = await loaded(args, settings, Path(tmp), (rate, callback), load, samples)
            finally:
                server.close()
    config = {
        "minutes": args.minutes,
        "overload": args.overload,
        "time_scale": args.time_scale,
        "capacity_jobs_per_s": round(cap.jobs_per_s, 2),
        "offered_jobs_per_s": round(rate, 2),
        "sample_s": args.sample_s,
        "drain_limit_s": args.drain_s,
        "settings": {k: str(v) for k, v in settings_over.items()},
        "processes": "python -m sluicegate api | relay | worker | webhooks",
    }
    return summarize(config, load, found, receiver, samples)


def summarize(
    config: dict[str, Any],
    load: Load,
    found: dict[str, Any],
    receiver: Receiver,
    samples: list[dict[str, Any]],
) -> dict[str, Any]:
    refused = Counter(a.reason for a in load.answers if a.status in (429, 503))
    others = Counter(str(a.status) for a in load.answers if a.status not in (202, 429, 503))
    latencies = [a.latency_s * 1000 for a in load.answers]
    webhook_ids = receiver.ids_by_job
    return {
        "config": config,
        "offered": len(load.answers) + load.not_sent,
        "not_sent_client_cap": load.not_sent,
        "accepted": len(load.accepted),
        "refused": sum(refused.values()),
        "refused_by_reason": dict(refused),
        "other_answers": dict(others),
        "submit_p50_ms": round(percentile(latencies, 0.5), 2),
        "submit_p99_ms": round(percentile(latencies, 0.99), 2),
        "load_s": round(found["load_s"], 1),
        "drain_s": round(found["drained_s"], 1),
        **found["ends"],
        "events_topic": found["topic"],
        "webhooks_received": receiver.attempts,
        "webhook_jobs_delivered": sum(1 for j in webhook_ids if j in load.accepted),
        "webhook_jobs_with_two_sequences": sum(
            1 for j, ids in webhook_ids.items() if j in load.accepted and len(ids) > 1
        ),
        "rss": memory_growth(samples),
        "exit_codes": found["exits"],
        "samples": samples,
    }


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
