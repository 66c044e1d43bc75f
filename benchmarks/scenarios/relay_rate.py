"""Relay rate: how many outbox rows one relay publishes a second, and its CPU per row, when
it is never short of work (full batches of ``relay_batch_size``).

What it measures and how: docs/benchmarks.md#relay_rate.

    python -m benchmarks.scenarios.relay_rate [--jobs 20000] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from pathlib import Path
from typing import Any

from benchmarks.lib.relay import measure
from benchmarks.lib.reports import OUT_DIR, write_report

OUT = OUT_DIR / "relay_rate.json"


async def run(args: argparse.Namespace) -> dict[str, Any]:
    return await measure(args.jobs)


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--quick", action="store_true", help="2,000 jobs, not written")
    parser.add_argument("--out", type=Path, default=None, help="default docs/bench/relay_rate.json")
    return parser


def headline(report: dict[str, Any]) -> dict[str, Any]:
    relay = report["relay"]
    return {"relay rows/s": relay["rows_per_s"], "relay CPU ms/row": relay["cpu_ms_per_row"]}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parser().parse_args(argv)
    if args.quick:
        args.jobs = min(args.jobs, 2000)
    logging.basicConfig(level=logging.ERROR)
    report = asyncio.run(run(args))
    print(
        f"filled {report['fill']['outbox_rows']} outbox rows in {report['fill']['seconds']} s; "
        f"one relay: {report['relay']['rows_per_s']} rows/s, "
        f"{report['relay']['cpu_ms_per_row']} CPU ms/row, CPU share {report['relay']['cpu_share']}"
    )
    out = args.out or (None if args.quick else OUT)
    if out is not None:
        write_report(report, out)
    return report


if __name__ == "__main__":
    main()
