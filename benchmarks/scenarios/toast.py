"""TOAST compression of jobs' inputs and results: insert rate and bytes per row with pglz,
and with lz4 where the server was built with it (migration 0019z).

What it measures and how: docs/benchmarks.md#toast.

    python -m benchmarks.scenarios.toast [--rows 20000] [--pg-bin DIR] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
from pathlib import Path
from typing import Any

from benchmarks.lib.reports import OUT_DIR, columns, write_report
from benchmarks.lib.toast import BATCH, job_rows, measure, server

OUT = OUT_DIR / "toast.json"


async def run(args: argparse.Namespace) -> dict[str, Any]:
    rows = job_rows(args.rows)
    given = os.environ.get("SLUICEGATE_BENCH_DATABASE_URL")
    servers: list[tuple[str, str | None, Path | None]] = [
        ("SLUICEGATE_BENCH_DATABASE_URL" if given else "embedded (wheel)", given, None)
    ]
    if args.pg_bin is not None:
        servers.append((str(args.pg_bin), None, args.pg_bin))
    measured = []
    for name, url, bin_dir in servers:
        async with server(url, bin_dir) as admin_url:
            measured.append(await measure(name, admin_url, rows))
    return {"rows": args.rows, "batch": BATCH, "servers": measured}


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument(
        "--pg-bin",
        type=Path,
        default=None,
        help="also measure a server started from these binaries (e.g. one built with lz4)",
    )
    parser.add_argument("--quick", action="store_true", help="1,000 rows, not written")
    parser.add_argument("--out", type=Path, default=None, help="default docs/bench/toast.json")
    return parser


def headline(report: dict[str, Any]) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    for found in report["servers"]:
        for method, m in found["methods"].items():
            key = f"PostgreSQL {found['version'].split()[0]} {method}"
            figures[f"{key} rows/s"] = m["insert_rows_per_s"]
            figures[f"{key} B/row"] = m["bytes_per_row"]
    return figures


def table(report: dict[str, Any]) -> str:
    rows = [["server / method", "rows/s", "B/row", "toast B/row", "input B", "stored", "read s"]]
    for found in report["servers"]:
        for method, m in found["methods"].items():
            rows.append(
                [
                    f"{found['server']} PG {found['version'].split()[0]} {method}",
                    str(m["insert_rows_per_s"]),
                    str(m["bytes_per_row"]),
                    str(m["toast_bytes_per_row"]),
                    str(m["input_raw_bytes_per_row"]),
                    str(m["input_stored_bytes_per_row"]),
                    str(m["read_all_s"]),
                ]
            )
    return columns(rows)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parser().parse_args(argv)
    if args.quick:
        args.rows = min(args.rows, 1000)
    logging.basicConfig(level=logging.WARNING)
    report = asyncio.run(run(args))
    for found in report["servers"]:
        if not found["lz4"]:
            print(f"{found['server']} (PostgreSQL {found['version']}): built without lz4")
    print(table(report))
    out = args.out or (None if args.quick else OUT)
    if out is not None:
        write_report(report, out)
    return report


if __name__ == "__main__":
    main()
