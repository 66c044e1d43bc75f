"""Costs: what one accepted job costs each process, PostgreSQL and the broker, measured.

What it measures and how: docs/benchmarks.md#costs. Not part of ``python -m benchmarks``
(it runs only with ``--only costs``).

    flock /tmp/bench.lock python -m benchmarks.scenarios.costs [--rate 4.5] [--load-s 75]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys
from pathlib import Path
from typing import Any

from benchmarks.lib.costs.measure import measure
from benchmarks.lib.costs.options import Options
from benchmarks.lib.plots.costs import plot_costs
from benchmarks.lib.processes import ROLES
from benchmarks.lib.reports import OUT_DIR, columns, write_report

OUT = OUT_DIR / "costs.json"
PROCESSES = (*ROLES, "postgres", "broker")
TOPICS = ("dispatch", "events", "dead_letter")


def show(report: dict[str, Any]) -> None:
    """The figures, readable; the JSON has them all."""
    windows = {k: w for k, w in report["windows"].items() if k != "idle"}
    gross, net = report["per_job_by_window"], report["per_job_net_of_idle_by_window"]
    print(f"\nper accepted job ({report['machine']['cpu_count']} CPUs; gross | net of idle):")
    head = ["", *(f"{n} ({w['jobs_accepted']} jobs)" for n, w in windows.items())]
    rows = [head]
    for proc in PROCESSES:
        rows.append(
            [
                f"cpu ms {proc}",
                *(
                    f"{gross[n]['cpu_ms'][proc]:.2f} | {net[n]['cpu_ms'][proc]:.2f}"
                    for n in windows
                ),
            ]
        )
    for label, key in (
        ("pg statements", "statements"),
        ("pg stmts w/o BEGIN/COMMIT", "statements_excluding_transaction_control"),
        ("pg transactions", "transactions"),
        ("pg WAL bytes", "wal_bytes"),
        ("pg rows written", "rows_written"),
    ):
        rows.append(
            [label, *(f"{gross[n]['pg'][key]:.1f} | {net[n]['pg'][key]:.1f}" for n in windows)]
        )
    for kind in ("records", "bytes"):
        for topic in TOPICS:
            rows.append(
                [
                    f"kafka {kind} {topic}",
                    *(f"{gross[n]['kafka'][kind][topic]:.2f}" for n in windows),
                ]
            )
    print(columns(rows))
    idle = report["idle_per_s"]
    print("\nidle per s: cpu ms " + ", ".join(f"{k} {v}" for k, v in idle["cpu_ms"].items()))
    print(f"idle per s: pg statements {idle['pg']['statements']}, WAL {idle['pg']['wal_bytes']} B")
    delivery = report.get("per_job", {}).get("webhook_delivery")
    if delivery:
        shown = {k: v for k, v in delivery.items() if k != "detail"}
        print(f"\nwebhook delivery, marginal (gross): {shown}")
    print(
        "\nrow widths: "
        + ", ".join(
            f"{k} {v['bytes_per_row']} B ({v['rows']} rows)"
            for k, v in report["row_widths"].items()
        )
    )
    for note in report["notes"]:
        print(f"note: {note}")
    single = report["windows"].get("single")
    if single:
        print("\ntop statements by calls per job (single):")
        for s in single["top_statements_by_calls"]:
            print(f"  {s['calls_per_job']:7.3f}  {s['mean_ms']} ms  {s['query'][:110]}")


def headline(report: dict[str, Any]) -> dict[str, Any]:
    job = report.get("per_job", {})
    cpu = job.get("cpu_ms", {})
    pg = job.get("pg", {})
    delivery = job.get("webhook_delivery", {})
    return {
        "CPU ms/job api/relay/worker/webhooks": " / ".join(f"{cpu.get(r)}" for r in ROLES),
        "CPU ms/job postgres / broker": f"{cpu.get('postgres')} / {cpu.get('broker')}",
        "PG statements / WAL B / rows per job": (
            f"{pg.get('statements')} / {pg.get('wal_bytes')} / {pg.get('rows_written')}"
        ),
        "webhook delivery CPU ms (webhooks)": delivery.get("cpu_ms_webhooks"),
    }


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    o = Options()
    parser.add_argument("--rate", type=float, default=o.rate, help="jobs/s offered in each window")
    parser.add_argument("--load-s", type=float, default=o.load_s, help="seconds of load a window")
    parser.add_argument("--idle-s", type=float, default=o.idle_s, help="the idle window's seconds")
    parser.add_argument(
        "--settle-s", type=float, default=o.settle_s, help="wait after the drain (statistics flush)"
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=o.batch_size,
        help="lines per batch in the batch window (0: none)",
    )
    parser.add_argument(
        "--time-scale", type=float, default=o.time_scale, help="x roofline step time"
    )
    parser.add_argument("--drain-s", type=float, default=o.drain_s, help="longest drain a window")
    parser.add_argument(
        "--capacity-warm-s",
        type=float,
        default=o.capacity_warm_s,
        help="engine s before measuring capacity",
    )
    parser.add_argument(
        "--capacity-measure-s",
        type=float,
        default=o.capacity_measure_s,
        help="engine s of capacity measured (0: not measured)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run under a minute; writes only with --out"
    )
    parser.add_argument("--out", type=Path, default=None, help="default docs/bench/costs.json")
    return parser


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parser().parse_args(argv)
    if args.quick:
        args.load_s, args.idle_s, args.settle_s = min(args.load_s, 5.0), 3.0, 2.0
        args.time_scale, args.capacity_measure_s = min(args.time_scale, 0.5), 0.0
        args.batch_size, args.drain_s = min(args.batch_size, 9), min(args.drain_s, 30.0)
    logging.basicConfig(level=logging.WARNING)
    options = Options(**{k: v for k, v in vars(args).items() if k != "out"})
    report = asyncio.run(measure(options))
    show(report)
    out = args.out or (None if args.quick else OUT)
    if out is not None:
        write_report(report, out, lambda png: plot_costs(report, path=png))
    undrained = [n for n, w in report["windows"].items() if w["jobs_ended"] < w["jobs_accepted"]]
    if undrained:
        print(f"NOT DRAINED: jobs not ended in {undrained}", file=sys.stderr)
    return report


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
