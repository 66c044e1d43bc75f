"""Retention: under a sustained load, the database stops growing once the window is reached.

What it measures and how: docs/benchmarks.md#retention. Not part of ``python -m
benchmarks`` (it runs only when named, like the soak).

    python -m benchmarks.scenarios.retention [--minutes 6] [--ended-s 60] [--outbox-s 30]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.lib.plots.retention import plot_retention
from benchmarks.lib.receivers import FailingReceiver
from benchmarks.lib.reports import OUT_DIR, write_report
from benchmarks.lib.retention.run import loaded, measure_rates, overrides, summarize, window_s
from benchmarks.lib.retention.show import show
from benchmarks.lib.stack import bench_settings, services

OUT = OUT_DIR / "retention.json"


async def run(args: argparse.Namespace) -> dict[str, Any]:
    plan = await measure_rates(args)
    receiver = FailingReceiver(fail_share=args.fail_share)
    server = await receiver.serve()
    settings_over = overrides(args, plan)
    window_s(args)  # a --batch-window that is not a duration stops the run here
    with tempfile.TemporaryDirectory(prefix="sluicegate-retention-") as tmp:
        async with (
            services() as (admin, bootstrap),
            bench_settings(admin, bootstrap, data_dir=Path(tmp), **settings_over) as settings,
        ):
            try:
                found = await loaded(args, settings, Path(tmp), receiver, plan.single_per_s)
            finally:
                server.close()
    return summarize(args, plan, settings_over, found, receiver)


def headline(report: dict[str, Any]) -> dict[str, Any]:
    grew = report["growth_after_window"]
    db = grew.get("database", {})
    jobs = report["steady_rows"].get("jobs", {})
    return {
        "database MiB at window / end": f"{db.get('at_window_mib')} / {db.get('at_end_mib')}",
        "growth after window %": db.get("growth_pct"),
        "growth MiB/min (slope)": db.get("slope_mib_per_min"),
        "steady jobs rows": jobs.get("mean"),
        "load jobs/s": report["load"]["accepted_jobs_per_s"],
    }


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--minutes", type=float, default=6.0, help="of load")
    parser.add_argument("--outbox-s", type=float, default=30.0, help="retention_outbox_s")
    parser.add_argument("--ended-s", type=float, default=60.0, help="retention_ended_s")
    parser.add_argument("--prune-interval-s", type=float, default=5.0, help="prune_interval_s")
    parser.add_argument("--prune-batch-rows", type=int, default=1000, help="prune_batch_rows")
    parser.add_argument(
        "--load", type=float, default=0.35, help="x the engine's capacity, batches included"
    )
    parser.add_argument(
        "--rate", type=float, default=None, help="jobs/s in all (skips measuring capacity)"
    )
    parser.add_argument("--time-scale", type=float, default=2.0, help="x roofline step time")
    parser.add_argument("--batch-size", type=int, default=20, help="lines per batch")
    parser.add_argument(
        "--batch-every-s", type=float, default=15.0, help="seconds between batches (0: none)"
    )
    parser.add_argument("--batch-window", default="1m", help="the batches' completion_window")
    parser.add_argument(
        "--fail-share", type=float, default=0.05, help="jobs whose webhooks always get 500"
    )
    parser.add_argument("--sample-s", type=float, default=5.0)
    parser.add_argument("--drain-s", type=float, default=60.0, help="longest wait after load")
    parser.add_argument(
        "--capacity-warm-s", type=float, default=20.0, help="engine s before measuring capacity"
    )
    parser.add_argument(
        "--capacity-measure-s", type=float, default=30.0, help="engine s of capacity measured"
    )
    parser.add_argument(
        "--quick", action="store_true", help="a 1.5-minute smoke run; writes only with --out"
    )
    parser.add_argument("--out", type=Path, default=None, help="default docs/bench/retention.json")
    return parser


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parser().parse_args(argv)
    if args.quick:
        args.minutes = min(args.minutes, 1.5)
        args.outbox_s, args.ended_s = min(args.outbox_s, 10.0), min(args.ended_s, 20.0)
        args.prune_interval_s, args.sample_s = min(args.prune_interval_s, 3.0), 3.0
        args.batch_window, args.drain_s = "20s", min(args.drain_s, 30.0)
        args.capacity_warm_s, args.capacity_measure_s = 8.0, 6.0
    if not 0 < args.load < 1:
        raise SystemExit("--load must be a share of the capacity below 1")
    logging.basicConfig(level=logging.WARNING)
    report = asyncio.run(run(args))
    show(report)
    out = args.out or (None if args.quick else OUT)
    if out is not None:
        write_report(report, out, lambda png: plot_retention(report, path=png))
    grew = report["growth_after_window"]
    if grew.get("flat") is False:
        print(f"NOT FLAT: {grew['flat_rule']} does not hold", file=sys.stderr)
    if report["end"]["subjects_never_delivered"] or report["end"]["unended_jobs_left"]:
        print("FAILED: jobs or batches never reached the receiver", file=sys.stderr)
    return report


if __name__ == "__main__":
    main()
