"""Isolation of the pools: model A flooded at 3 times its pool's capacity while model B runs at
half of its own, against B alone, in one run.

What it measures and how: docs/benchmarks.md#isolation.

    python -m benchmarks.scenarios.isolation [--phase-s 30] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import time
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks.lib.reports import OUT_DIR, percentile, write_report
from benchmarks.lib.stack import TERMINAL, Bench, job_rows, pipeline, services
from schemas import constants
from schemas.tables import jobs
from workers.service import run_worker

OUT = OUT_DIR / "isolation.json"
MAX_TOKENS = 64
HEADERS = {constants.HEADER_TENANT: "bench"}


async def offer(bench: Bench, model: str, rate: float, seconds: float) -> list[tuple[int, str]]:
    """Submits of ``model`` at ``rate`` a second for ``seconds`` (open loop: each on its own
    task); (status, job id or error code) of each."""

    async def one() -> tuple[int, str]:
        body = {"kind": "complete", "input": "x " * 200, "max_tokens": MAX_TOKENS, "model": model}
        r = await bench.client.post("/v1/jobs", json=body, headers=HEADERS)
        found = r.json()
        return r.status_code, found.get("id") or found["error"]["code"]

    tasks = []
    began = time.monotonic()
    for i in range(int(rate * seconds)):
        await asyncio.sleep(max(0.0, began + i / rate - time.monotonic()))
        tasks.append(asyncio.create_task(one()))
    return list(await asyncio.gather(*tasks))


async def ended(bench: Bench, ids: list[str], within_s: float = 120) -> list[dict[str, Any]]:
    deadline = time.monotonic() + within_s
    while True:
        rows = await job_rows(
            bench,
            jobs.c.id,
            jobs.c.state,
            jobs.c.created_at,
            jobs.c.finished_at,
            where=jobs.c.id.in_(ids),
        )
        if all(r["state"] in TERMINAL for r in rows) or time.monotonic() > deadline:
            return rows
        await asyncio.sleep(0.5)


async def capacity(bench: Bench, seconds: float) -> float:
    """Jobs a second one pool (one worker) ends at saturation: A flooded for ``seconds``."""
    answers = await offer(bench, "alpha", 200, seconds)
    ids = [j for code, j in answers if code == 202]
    rows = await ended(bench, ids)
    done = [r for r in rows if r["state"] == "succeeded"]
    span = max(r["finished_at"] for r in done) - min(r["created_at"] for r in done)
    return float(len(done) / span.total_seconds())


def summary(answers: list[tuple[int, str]], rows: list[dict[str, Any]]) -> dict[str, Any]:
    latency = [
        (r["finished_at"] - r["created_at"]).total_seconds()
        for r in rows
        if r["state"] == "succeeded"
    ]
    codes = Counter(code for code, _ in answers)
    return {
        "offered": len(answers),
        "accepted": codes[202],
        "refused": len(answers) - codes[202],
        "acceptance": round(codes[202] / len(answers), 4) if answers else None,
        "succeeded": len(latency),
        "p50_s": round(percentile(latency, 0.5), 3),
        "p99_s": round(percentile(latency, 0.99), 3),
    }


async def phase(bench: Bench, cap: float, seconds: float, flood: bool) -> dict[str, Any]:
    b = offer(bench, "beta", cap / 2, seconds)
    if flood:
        b_answers, a_answers = await asyncio.gather(b, offer(bench, "alpha", cap * 3, seconds))
    else:
        b_answers, a_answers = await b, []
    b_rows = await ended(bench, [j for code, j in b_answers if code == 202])
    report = {"beta": summary(b_answers, b_rows)}
    if flood:
        a_rows = await ended(bench, [j for code, j in a_answers if code == 202], within_s=300)
        report["alpha"] = summary(a_answers, a_rows)
        report["alpha"]["refusals"] = dict(Counter(j for c, j in a_answers if c != 202))
    return report


async def run(args: argparse.Namespace) -> dict[str, Any]:
    pools: dict[str, dict[str, Any]] = {"alpha": {}, "beta": {}}
    overrides = {
        "pools": pools,
        "models": list(pools),
        "lag_soft": args.lag_soft,
        "lag_hard": args.lag_soft * 2,
        "admission_mode": "reject",
        "sim_time_scale": args.time_scale,
        "sim_num_blocks": args.blocks,
    }
    async with services() as (admin, bootstrap), pipeline(admin, bootstrap, **overrides) as bench:
        bench.start_relay()
        for model in pools:
            own = bench.settings.model_copy(update={"worker_model": model})
            bench.tasks.append(asyncio.create_task(run_worker(own, bench.stop)))
        await asyncio.sleep(5)  # the workers join their groups
        cap = await capacity(bench, args.calibrate_s)
        alone = await phase(bench, cap, args.phase_s, flood=False)
        flooded = await phase(bench, cap, args.phase_s, flood=True)
    return {
        "config": {
            "phase_s": args.phase_s,
            "max_tokens": MAX_TOKENS,
            "lag_soft": args.lag_soft,
            "time_scale": args.time_scale,
            "workers_per_pool": 1,
        },
        "capacity_jobs_per_s": round(cap, 2),
        "beta_alone": alone["beta"],
        "beta_with_alpha_flooded": flooded["beta"],
        "alpha_flooded": flooded["alpha"],
    }


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--phase-s", type=float, default=30.0, help="each phase's length")
    parser.add_argument("--calibrate-s", type=float, default=10.0, help="the capacity flood")
    parser.add_argument("--lag-soft", type=int, default=100, help="each pool's lag_soft")
    parser.add_argument("--time-scale", type=float, default=1.0, help="the simulator's")
    parser.add_argument("--blocks", type=int, default=2000, help="each simulated GPU's KV")
    parser.add_argument("--quick", action="store_true", help="5 s phases, not written")
    parser.add_argument("--out", type=Path, default=None, help="default docs/bench/isolation.json")
    return parser


def headline(report: dict[str, Any]) -> dict[str, Any]:
    alone, flooded = report["beta_alone"], report["beta_with_alpha_flooded"]
    return {
        "beta acceptance alone / A flooded": f"{alone['acceptance']} / {flooded['acceptance']}",
        "beta p99 s alone / A flooded": f"{alone['p99_s']} / {flooded['p99_s']}",
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parser().parse_args(argv)
    if args.quick:
        args.phase_s, args.calibrate_s = 5.0, 3.0
    logging.basicConfig(level=logging.ERROR)
    report = asyncio.run(run(args))
    print(f"capacity of one pool (one simulated worker): {report['capacity_jobs_per_s']} jobs/s")
    print(f"{'':<28}{'offered':>8}{'accepted':>9}{'refused':>8}{'p50 s':>8}{'p99 s':>8}")
    for name in ("beta_alone", "beta_with_alpha_flooded", "alpha_flooded"):
        s = report[name]
        print(
            f"{name:<28}{s['offered']:>8}{s['accepted']:>9}{s['refused']:>8}"
            f"{s['p50_s']:>8}{s['p99_s']:>8}"
        )
    out = args.out or (None if args.quick else OUT)
    if out is not None:
        write_report(report, out)
    return report


if __name__ == "__main__":
    main()
