"""Brokers: Apache Kafka 4.1 (KRaft, the production broker) against Tansu (the memory-only
fallback) in one run, on the same machine, the same scenarios one after the other.

What it measures and how: docs/benchmarks.md#brokers.

    python -m benchmarks.scenarios.brokers [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.lib import relay
from benchmarks.lib.costs.measure import measure
from benchmarks.lib.costs.options import Options
from benchmarks.lib.ingress import SubmitLoad, sluicegate_runs
from benchmarks.lib.ingress_runs import bench_modules
from benchmarks.lib.reports import OUT_DIR, columns, percentile, write_report
from benchmarks.lib.stack import make_broker, pipeline, services

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
    runs = await sluicegate_runs(
        SubmitLoad(
            clients=args.clients,
            seconds=args.seconds,
            alone_seconds=args.seconds / 2,
            warmup=1.0,
            batch_clients=1,
        )
    )
    single, alone = runs[f"single_{args.clients}_clients"], runs["single_1_client"]
    return {
        f"{args.clients}_clients": {k: single.get(k) for k in ("jobs_per_s", "p50_ms", "p99_ms")},
        "1_client": {k: alone.get(k) for k in ("jobs_per_s", "p50_ms", "p99_ms")},
    }


async def broker_cpu(args: argparse.Namespace) -> dict[str, Any]:
    options = Options(
        load_s=args.costs_load_s,
        idle_s=5.0,
        settle_s=3.0,
        batch_size=0,
        capacity_measure_s=0.0,
        time_scale=0.5,
    )
    report = await measure(options)
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
    found["relay"] = (await relay.measure(args.relay_jobs))["relay"]
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
    bench_modules()
    report = asyncio.run(run(args))
    print(table(report))
    out = args.out or (None if args.quick else OUT)
    if out is not None:
        write_report(report, out)
    return report


if __name__ == "__main__":
    main()
