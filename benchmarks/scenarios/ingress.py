"""Ingress: how many jobs a second Sluicegate accepts, and how fast it answers a submit,
against the same machine's baselines: Celery's ``apply_async`` on the local Redis broker
(not durable) and on the local RabbitMQ (durable: persistent, confirmed); from aiohttp
clients, the project's own client and wrk (C), on one and two API processes.

What it measures and how: docs/benchmarks.md#ingress. Needs the ``bench`` extra:
pip install -e '.[bench]' (celery, redis, aiohttp, matplotlib); and, from Debian,
redis-server, rabbitmq-server and wrk.

    python -m benchmarks.scenarios.ingress [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
from pathlib import Path
from typing import Any

from benchmarks.lib.ingress import SubmitLoad, sluicegate_runs
from benchmarks.lib.ingress_baselines import celery_rabbitmq, celery_redis
from benchmarks.lib.ingress_runs import DOCUMENT, bench_modules
from benchmarks.lib.reports import OUT_DIR, write_report

OUT = OUT_DIR / "ingress.json"


def baselines(args: argparse.Namespace) -> dict[str, Any]:
    seconds, size = args.seconds, args.batch_size
    return {
        "redis": celery_redis(args.threads, seconds, size),
        "rabbitmq": celery_rabbitmq(args.threads, seconds, size),
    }


def _best(runs: dict[str, Any], names: list[str]) -> tuple[str, dict[str, Any]]:
    found = [(n, runs[n]) for n in names if n in runs]
    return max(found, key=lambda item: item[1]["jobs_per_s"])


def report(args: argparse.Namespace, celery: dict[str, Any], sg: dict[str, Any]) -> dict[str, Any]:
    one, *more = [f"{n}_api_process{'es' if n > 1 else ''}" for n in args.api_processes]
    first = sg[one]
    redis = celery["redis"]["single_1_thread"]
    rabbit = celery["rabbitmq"]
    compared: dict[str, Any] = {"Celery apply_async -> Redis, 1 thread": redis}
    if "single_1_thread" in rabbit:
        threads, best = _best(rabbit, ["single_1_thread", f"single_{args.threads}_threads"])
        compared[f"Celery apply_async -> RabbitMQ durable, {threads.split('_')[1]} thread(s)"] = (
            best
        )
    client = f"client_{args.clients}_tasks"
    wrk = f"wrk_{max(args.wrk)}_connections"
    for name in (one, *more):
        processes = name.split("_")[0]
        compared[f"Sluicegate client, {args.clients} tasks, {processes} API"] = sg[name][client]
        if wrk in sg[name]:
            compared[f"wrk -> POST /v1/jobs, {max(args.wrk)} conns, {processes} API"] = sg[name][
                wrk
            ]
    compared[f"aiohttp -> POST /v1/jobs, {args.clients} clients, 1 API"] = first[
        f"single_{args.clients}_clients"
    ]
    compared[f"Celery group of {args.batch_size} -> Redis"] = redis_group = celery["redis"][
        f"group_of_{args.batch_size}"
    ]
    batches = first[f"batches_of_{args.batch_size}_{args.batch_clients}_clients"]
    compared[f"Sluicegate POST /v1/batches of {args.batch_size}"] = batches
    latency = {
        "Celery apply_async -> Redis, 1 thread": redis,
        "Sluicegate client, 1 task": first["client_1_task"],
        "Sluicegate blocking client, a plain loop": first["blocking_client_loop"],
        "aiohttp -> POST /v1/jobs, 1 client": first["single_1_client"],
        **{
            f"wrk -> POST /v1/jobs, {c} conns": first[f"wrk_{c}_connections"]
            for c in args.wrk
            if f"wrk_{c}_connections" in first
        },
    }
    best_client = max(sg[n][client]["jobs_per_s"] for n in (one, *more))
    best_wrk = max((sg[n][wrk]["jobs_per_s"] for n in (one, *more) if wrk in sg[n]), default=0.0)
    ratios = {
        "client_64_over_celery_redis": round(best_client / redis["jobs_per_s"], 2),
        "wrk_64_over_celery_redis": round(best_wrk / redis["jobs_per_s"], 2),
        "batches_over_celery_group": round(batches["jobs_per_s"] / redis_group["jobs_per_s"], 2),
    }
    return {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}",
        "payload": f"a {len(DOCUMENT.encode())}-byte document to summarize, max_tokens 256",
        "compared": compared,
        "latency": latency,
        "sluicegate": sg,
        "celery": celery,
        "ratios": ratios,
        "targets": {
            "client_at_least_1x_celery_redis": ratios["client_64_over_celery_redis"] >= 1.0,
            "wrk_at_least_1_5x_celery_redis": ratios["wrk_64_over_celery_redis"] >= 1.5,
            "batches_at_least_5000_jobs_per_s": batches["jobs_per_s"] >= 5000,
            "one_caller_at_least_1000_jobs_per_s": max(
                first["client_1_task"]["jobs_per_s"], first["blocking_client_loop"]["jobs_per_s"]
            )
            >= 1000,
        },
    }


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few seconds")
    load = SubmitLoad()
    parser.add_argument("--seconds", type=float, default=load.seconds, help="each loaded scenario")
    parser.add_argument(
        "--alone-seconds", type=float, default=load.alone_seconds, help="the one-client run"
    )
    parser.add_argument("--warmup", type=float, default=load.warmup)
    parser.add_argument(
        "--clients", type=int, default=load.clients, help="concurrent single submitters"
    )
    parser.add_argument("--threads", type=int, default=8, help="concurrent Celery callers")
    parser.add_argument("--batch-size", type=int, default=load.batch_size)
    parser.add_argument("--batch-clients", type=int, default=load.batch_clients)
    parser.add_argument(
        "--api-processes",
        type=_counts,
        default=load.api_processes,
        help="sluicegate api --workers, as 1,2: every run on the first, the loaded single "
        "submits on each",
    )
    parser.add_argument(
        "--wrk", type=_counts, default=load.wrk_connections, help="wrk's connections, as 1,16,64"
    )
    parser.add_argument("--out", type=Path, default=None, help="default docs/bench/ingress.json")
    parser.add_argument("--no-plot", action="store_true")
    return parser


def _counts(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(","))


def headline(result: dict[str, Any]) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    for name, row in result["compared"].items():
        figures[f"{name}: jobs/s, p50 / p99 ms"] = (
            f"{row['jobs_per_s']:.0f}, {row.get('p50_ms')} / {row.get('p99_ms')}"
        )
    figures.update(result["ratios"])
    return figures


def _plot(result: dict[str, Any], png: Path) -> None:
    from benchmarks.lib.plots.ingress import plot_ingress  # the plots extra is optional here

    plot_ingress(result, path=png)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parser().parse_args(argv)
    if args.quick:
        args.seconds, args.alone_seconds, args.warmup, args.batch_clients = 2.0, 1.0, 0.5, 2
    out = args.out or (None if args.quick else OUT)
    bench_modules()
    celery = baselines(args)
    load = SubmitLoad(
        clients=args.clients,
        seconds=args.seconds,
        alone_seconds=args.alone_seconds,
        warmup=args.warmup,
        batch_size=args.batch_size,
        batch_clients=args.batch_clients,
        api_processes=args.api_processes,
        wrk_connections=args.wrk,
    )
    sg = asyncio.run(sluicegate_runs(load))
    result = report(args, celery, sg)
    for figure, value in headline(result).items():
        print(f"{figure}: {value}")
    print(f"targets: {result['targets']}")
    if out is not None:
        write_report(result, out, None if args.no_plot else lambda png: _plot(result, png))
    return result


if __name__ == "__main__":
    main()
