"""A 50,000-line OpenAI Batch file through `sluicegate api` as a subprocess: how fast it is
uploaded and made a batch, and the API process's resident memory while it takes each
(docs/benchmarks.md#files).

    python -m benchmarks.scenarios.files [--lines 50000] [--line-bytes 1000] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.lib.ingress import served
from benchmarks.lib.ingress_runs import Served
from benchmarks.lib.reports import OUT_DIR, write_report
from benchmarks.lib.sampling import PeakRss
from benchmarks.lib.stack import bench_settings, services

OUT = OUT_DIR / "files.json"
TENANT = {"X-Sluicegate-Tenant": "bench"}


def write_file(path: Path, lines: int, line_bytes: int) -> int:
    """``lines`` chat requests of about ``line_bytes`` bytes each; the file's size."""
    words = ("the sluice gate holds the water back until the level is right " * 40)[:line_bytes]
    with path.open("w") as out:
        for i in range(lines):
            line = {
                "custom_id": f"doc-{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {
                    "model": "sim",
                    "messages": [{"role": "user", "content": f"Summarize: {words}"}],
                    "max_tokens": 64,
                },
            }
            out.write(json.dumps(line) + "\n")
    return path.stat().st_size


def timed_call(api: Served, call: Any) -> dict[str, Any]:
    rss = PeakRss(api.api_pid)
    before = rss.now()
    with rss:
        began = time.perf_counter()
        answer = call()
        elapsed = time.perf_counter() - began
    assert answer.status_code < 300, answer.text[:500]
    return {
        "seconds": round(elapsed, 3),
        "rss_before_mib": round(before / 2**20, 1),
        "rss_peak_mib": round(rss.peak / 2**20, 1),
        "answer": answer.json(),
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="sluicegate-files-") as tmp:
        path = Path(tmp) / "requests.jsonl"
        size = write_file(path, args.lines, args.line_bytes)
        async with (
            services() as (admin, bootstrap),
            bench_settings(admin, bootstrap, lag_soft=10**7, lag_hard=10**7 + 1) as settings,
            served(settings, processes=1) as api,
        ):

            def upload() -> httpx.Response:
                with httpx.Client(base_url=api.url, timeout=600) as client, path.open("rb") as f:
                    files = {"file": ("requests.jsonl", f)}
                    return client.post(
                        "/v1/files", files=files, data={"purpose": "batch"}, headers=TENANT
                    )

            up = await asyncio.to_thread(timed_call, api, upload)
            body = {"input_file_id": up["answer"]["id"], "endpoint": "/v1/chat/completions"}

            def create() -> httpx.Response:
                with httpx.Client(base_url=api.url, timeout=600) as client:
                    return client.post("/v1/batches", json=body, headers=TENANT)

            made = await asyncio.to_thread(timed_call, api, create)
    return {
        "lines": args.lines,
        "file_mib": round(size / 2**20, 1),
        "upload": {**up, "answer": None},
        "upload_mib_per_s": round(size / 2**20 / up["seconds"], 1),
        "upload_lines_per_s": round(args.lines / up["seconds"]),
        "batch": {**made, "answer": None},
        "batch_lines_per_s": round(args.lines / made["seconds"]),
        "batch_total": made["answer"]["request_counts"]["total"],
    }


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.scenarios.files", description=__doc__)
    p.add_argument("--lines", type=int, default=50_000)
    p.add_argument("--line-bytes", type=int, default=1000, help="about this many per line")
    p.add_argument("--quick", action="store_true", help="2,000 lines, no report")
    p.add_argument("--out", type=Path, default=None, help=f"the JSON report (default {OUT})")
    return p


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parser().parse_args(argv)
    if args.quick:
        args.lines = 2_000
    result = asyncio.run(run(args))
    print(
        f"{result['lines']} lines, {result['file_mib']} MiB: upload "
        f"{result['upload']['seconds']} s ({result['upload_mib_per_s']} MiB/s, "
        f"{result['upload_lines_per_s']} lines/s), API RSS {result['upload']['rss_before_mib']}"
        f" -> peak {result['upload']['rss_peak_mib']} MiB"
    )
    print(
        f"batch from the file: {result['batch']['seconds']} s "
        f"({result['batch_lines_per_s']} lines/s, {result['batch_total']} jobs), API RSS "
        f"{result['batch']['rss_before_mib']} -> peak {result['batch']['rss_peak_mib']} MiB"
    )
    out = args.out or (None if args.quick else OUT)
    if out is not None:
        write_report(result, out)
    return result


if __name__ == "__main__":
    main()
