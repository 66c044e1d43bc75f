"""Brokers: Apache Kafka 4.1 (KRaft, the production broker) against Tansu (the memory-only
fallback) in one run, on the same machine, the same scenarios one after the other:

- the broker's start: from its process's start to its first answer to a client, and its
  RSS then (a fresh log: Apache Kafka formats it first);
- ingress: single submits from ``--clients`` (64) aiohttp clients and from one, through
  ``sluicegate api`` and ``sluicegate relay`` as processes (``benchmarks.ingress``, without
  its Celery baseline);
- a short job end to end: ``--short`` jobs (8 tokens) submitted one at a time to the API,
  the relay and a worker (in this process), each timed from the submit to the answer of a
  long-poll (``GET /v1/jobs/{id}?wait=``) that returns at its terminal state: p50 and p99;
- the relay's saturated rows/s: one relay publishing a full outbox (``benchmarks.relay_rate``);
- the broker's CPU per job: the costs benchmark's ``single`` window (``benchmarks.costs``,
  shortened), the broker process's CPU over the jobs accepted in it.

The broker is chosen with SLUICEGATE_BENCH_BROKER for each half (``benchmarks.harness``).
Writes docs/bench/brokers.json. Run: python -m benchmarks.brokers [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import costs, ingress, relay_rate
from benchmarks.harness import (
    OUT_DIR,
    columns,
    make_broker,
    percentile,
    pipeline,
    services,
    write_report,
)

OUT = OUT_DIR / "brokers.json"
KINDS = ("kafka", "tansu")
SHORT_JOB = {"kind": "complete", "input": "Say one word.", "max_tokens": 8}


async def start_and_size() -> dict[str, Any]:
    """A fresh broker's start (process start to first answer) and its RSS then."""
    with tempfile.TemporaryDirectory(prefix="sluicegate-bench-broker-") as tmp:
        broker = make_broker(Path(tmp))
        began = time.monotonic()
        await broker.start()
        try:
            seconds = time.monotonic() - began
            rss = _rss(broker.pid)
        finally:
            broker.stop()
    return {"start_s": round(seconds, 2), "rss_mib": round(rss / 2**20, 1) if rss else None}


def _rss(pid: int | None) -> int | None:
    import psutil

    return psutil.Process(pid).memory_info().rss if pid is not None else None


async def short_jobs(count: int) -> dict[str, Any]:
    """``count`` short jobs one after another: submit to terminal, through the broker."""
    async with services() as (admin, bootstrap), pipeline(admin, bootstrap) as bench:
        bench.start_relay()
        bench.start_worker()
        latencies: list[float] = []
        for i in range(count + 5):  # the first five warm the group and the connections
            began = time.perf_counter()
            r = await bench.client.post("/v1/jobs", json=SHORT_JOB)
            r.raise_for_status()
            job = r.json()["id"]
            while True:
                view = await bench.client.get(f"/v1/jobs/{job}", params={"wait": 30})
                if view.json()["state"] in ("succeeded", "failed", "expired"):
                    break
            assert view.json()["state"] == "succeeded", view.text
            if i >= 5:
                latencies.append((time.perf_counter() - began) * 1000)
    return {
        "jobs": count,
        "p50_ms": round(percentile(latencies, 0.5), 1),
        "p99_ms": round(percentile(latencies, 0.99), 1),
        "max_ms": round(max(latencies), 1),
    }


async def ingress_runs(args: argparse.Namespace) -> dict[str, Any]:
    runs = await ingress.sluicegate_runs(
        ingress.parser().parse_args(
            [
                "--clients",
                str(args.clients),
                "--seconds",
                str(args.seconds),
                "--alone-seconds",
                str(args.seconds / 2),
                "--warmup",
                "1",
                "--batch-clients",
                "1",
            ]
        )
    )
    single, alone = runs[f"single_{args.clients}_clients"], runs["single_1_client"]
    return {
        f"{args.clients}_clients": {k: single.get(k) for k in ("jobs_per_s", "p50_ms", "p99_ms")},
        "1_client": {k: alone.get(k) for k in ("jobs_per_s", "p50_ms", "p99_ms")},
    }


async def broker_cpu(args: argparse.Namespace) -> dict[str, Any]:
    argv = ["--load-s", str(args.costs_load_s), "--idle-s", "5", "--settle-s", "3"]
    argv += ["--batch-size", "0", "--capacity-measure-s", "0", "--time-scale", "0.5"]
    report = await costs.measure(costs.parser().parse_args(argv))
    return {
        "jobs": report["windows"]["single"]["jobs_accepted"],
        "cpu_ms_per_job_broker": report["per_job"]["cpu_ms"]["broker"],
        "cpu_ms_per_job_broker_net_of_idle": report["per_job_net_of_idle"]["cpu_ms"]["broker"],
        "idle_cpu_ms_per_s_broker": report["idle_per_s"]["cpu_ms"]["broker"],
    }


async def one_broker(kind: str, args: argparse.Namespace) -> dict[str, Any]:
    os.environ["SLUICEGATE_BENCH_BROKER"] = kind
    print(f"--- {kind}")
    found: dict[str, Any] = {"start": await start_and_size()}
    print(f"start: {found['start']}")
    found["ingress"] = await ingress_runs(args)
    print(f"ingress: {found['ingress']}")
    found["short_job"] = await short_jobs(args.short)
    print(f"short job: {found['short_job']}")
    found["relay"] = (await relay_rate.run(argparse.Namespace(jobs=args.relay_jobs)))["relay"]
    print(f"relay: {found['relay']}")
    if args.costs_load_s > 0:
        found["broker_cpu"] = await broker_cpu(args)
        print(f"broker CPU: {found['broker_cpu']}")
    return found


async def run(args: argparse.Namespace) -> dict[str, Any]:
    before = os.environ.get("SLUICEGATE_BENCH_BROKER")
    try:
        measured = {kind: await one_broker(kind, args) for kind in KINDS}
    finally:
        if before is None:
            os.environ.pop("SLUICEGATE_BENCH_BROKER", None)
        else:
            os.environ["SLUICEGATE_BENCH_BROKER"] = before
    return {
        "config": {
            "clients": args.clients,
            "seconds": args.seconds,
            "short_jobs": args.short,
            "relay_jobs": args.relay_jobs,
            "costs_load_s": args.costs_load_s,
            "cpus": os.cpu_count(),
        },
        **measured,
    }


def table(report: dict[str, Any]) -> str:
    rows: list[tuple[str, ...]] = [("", *KINDS)]

    def row(label: str, *path: str) -> None:
        values = []
        for kind in KINDS:
            value: Any = report[kind]
            for key in path:
                value = value.get(key) if isinstance(value, dict) else None
            values.append("-" if value is None else str(value))
        rows.append((label, *values))

    clients = report["config"]["clients"]
    row("start s", "start", "start_s")
    row("RSS at start, MiB", "start", "rss_mib")
    row(f"ingress {clients} clients, jobs/s", "ingress", f"{clients}_clients", "jobs_per_s")
    row(f"ingress {clients} clients, p99 ms", "ingress", f"{clients}_clients", "p99_ms")
    row("ingress 1 client, jobs/s", "ingress", "1_client", "jobs_per_s")
    row("short job p50 ms", "short_job", "p50_ms")
    row("short job p99 ms", "short_job", "p99_ms")
    row("relay rows/s (saturated)", "relay", "rows_per_s")
    row("relay CPU ms/row", "relay", "cpu_ms_per_row")
    row("broker CPU ms/job", "broker_cpu", "cpu_ms_per_job_broker")
    row("broker CPU ms/job, net of idle", "broker_cpu", "cpu_ms_per_job_broker_net_of_idle")
    row("broker CPU idle, ms/s", "broker_cpu", "idle_cpu_ms_per_s_broker")
    return columns(rows)


def headline(report: dict[str, Any]) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    for kind in KINDS:
        r = report[kind]
        figures[f"{kind}: short job p50 / p99 ms"] = (
            f"{r['short_job']['p50_ms']} / {r['short_job']['p99_ms']}"
        )
        figures[f"{kind}: relay rows/s"] = r["relay"]["rows_per_s"]
    return figures


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--clients", type=int, default=64, help="concurrent single submitters")
    parser.add_argument("--seconds", type=float, default=10.0, help="the loaded ingress run")
    parser.add_argument("--short", type=int, default=200, help="short jobs, one at a time")
    parser.add_argument("--relay-jobs", type=int, default=20_000, help="the relay's backlog")
    parser.add_argument(
        "--costs-load-s", type=float, default=40.0, help="the costs window (0: not measured)"
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run; writes only with --out")
    parser.add_argument("--out", type=Path, default=None, help="default docs/bench/brokers.json")
    return parser


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parser().parse_args(argv)
    if args.quick:
        args.seconds, args.short, args.relay_jobs, args.costs_load_s = 2.0, 20, 2000, 0.0
    ingress.bench_modules()
    report = asyncio.run(run(args))
    print(table(report))
    out = args.out or (None if args.quick else OUT)
    if out is not None:
        write_report(report, out)
    return report


if __name__ == "__main__":
    main()
