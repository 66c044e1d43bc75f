"""Ingress: how many jobs a second Sluicegate accepts, and how fast it answers a submit,
against the same machine's baseline: Celery's ``apply_async`` on the local Redis broker.

What it measures and how: docs/benchmarks.md#ingress. Needs the ``bench`` extra:
pip install -e '.[bench]' (celery, redis, aiohttp, matplotlib).

    python -m benchmarks.scenarios.ingress [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.lib.ingress import (
    DOCUMENT,
    JOB,
    Run,
    SubmitLoad,
    bench_modules,
    sluicegate_runs,
)
from benchmarks.lib.reports import OUT_DIR, write_report

OUT = OUT_DIR / "ingress.json"


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
        "--api-processes", type=int, default=load.api_processes, help="sluicegate api --workers"
    )
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
    from benchmarks.lib.plots.ingress import plot_ingress  # the plots extra is optional here

    plot_ingress(result, path=png)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parser().parse_args(argv)
    if args.quick:
        args.seconds, args.alone_seconds, args.warmup, args.batch_clients = 2.0, 1.0, 0.5, 2
    out = args.out or (None if args.quick else OUT)
    bench_modules()
    celery = celery_baseline(args)
    load = SubmitLoad(
        clients=args.clients,
        seconds=args.seconds,
        alone_seconds=args.alone_seconds,
        warmup=args.warmup,
        batch_size=args.batch_size,
        batch_clients=args.batch_clients,
        api_processes=args.api_processes,
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
