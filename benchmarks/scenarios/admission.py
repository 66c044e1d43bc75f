"""Admission benchmarks: the heptamini scenario and a 10x burst.

What it measures and how: docs/benchmarks.md#admission.

    python -m benchmarks.scenarios.admission [--burst-s 30] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import time
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks.lib.plots.admission import plot_admission
from benchmarks.lib.reports import OUT_DIR, percentile, write_report
from benchmarks.lib.stack import Bench, pipeline, services

OUT = OUT_DIR / "admission.json"
LONG_PROMPT = " ".join(["The sluice gate holds the water back until the lock is ready."] * 80)


async def submit(bench: Bench, body: dict[str, Any]) -> tuple[int, float, dict[str, Any]]:
    started = time.perf_counter()
    response = await bench.client.post("/v1/jobs", json=body)
    return response.status_code, time.perf_counter() - started, response.json()


async def heptamini(admin: str, bootstrap: str) -> dict[str, Any]:
    """Capacity of one job in flight, 20 concurrent clients, a 10 s job."""
    async with pipeline(
        admin,
        bootstrap,
        lag_soft=1,
        lag_hard=1,
        admission_mode="reject",
        deadline_aware=False,
        sim_max_num_seqs=1,
        sim_time_scale=280.0,  # ~1000 prompt tokens, one 36 ms prefill step: a 10 s job
        lag_interval_s=0.5,
    ) as bench:
        bench.start_relay()
        bench.start_worker()
        body = {"kind": "complete", "input": LONG_PROMPT, "max_tokens": 1, "ttl_s": 600}
        results = await asyncio.gather(*(submit(bench, body) for _ in range(20)))
        codes = Counter(code for code, _, _ in results)
        hints = [b["retry_after_ms"] for code, _, b in results if code == 429]
        latencies = [lat for _, lat, _ in results]
        await asyncio.sleep(1.0)
        lag = bench.app.state.monitor.snapshot().lag
    return {
        "accepted": codes[202],
        "yielded": codes[429],
        "retry_after_ms_min": min(hints, default=None),
        "retry_after_ms_max": max(hints, default=None),
        "submit_p50_ms": percentile(latencies, 0.5) * 1000,
        "submit_p99_ms": percentile(latencies, 0.99) * 1000,
        "lag_after_1s": lag,
    }


async def burst(
    admin: str, bootstrap: str, mode: str, seconds: float = 30.0, join_s: float = 6.0
) -> dict[str, Any]:
    """10x the drain rate for ``seconds``: one worker drains ~10 jobs/s, 100 jobs/s arrive."""
    soft, hard = 50, 100
    async with pipeline(
        admin,
        bootstrap,
        lag_soft=soft,
        lag_hard=hard,
        admission_mode=mode,
        max_block_ms=1000,
        max_blocked=64,
        deadline_aware=False,
        sim_max_num_seqs=4,
        sim_time_scale=1.3,  # a small batch's decode step (7.8 ms on the roofline): ~10 ms
        lag_interval_s=0.5,
    ) as bench:
        bench.start_relay()
        bench.start_worker()
        await asyncio.sleep(join_s)  # let the worker join its group
        body = {
            "kind": "complete",
            "input": "Summarize the state of the sluice.",
            "ttl_s": 600,
            "max_tokens": 40,
        }
        results: list[tuple[float, int, float, dict[str, Any]]] = []
        samples: list[tuple[float, int]] = []
        start = time.monotonic()

        async def one() -> None:
            sent = time.monotonic() - start
            code, latency, answer = await submit(bench, body)
            results.append((sent, code, latency, answer))

        async def sample() -> None:
            while time.monotonic() - start < seconds + 2:
                samples.append((time.monotonic() - start, bench.app.state.monitor.snapshot().lag))
                await asyncio.sleep(0.25)

        sampler = asyncio.create_task(sample())
        tasks = []
        rate = 100.0
        for i in range(int(rate * seconds)):
            delay = start + i / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one()))
        await asyncio.gather(*tasks)
        await sampler
    return burst_figures(results, samples, seconds=seconds, soft=soft, hard=hard)


def burst_figures(
    results: list[tuple[float, int, float, dict[str, Any]]],
    samples: list[tuple[float, int]],
    *,
    seconds: float,
    soft: int,
    hard: int,
) -> dict[str, Any]:
    """The burst's answers ((sent at, status, latency, body) each) and lag readings, as
    figures."""
    blocked = [r for r in results if r[1] == 202 and r[2] > 0.05]  # waited before admission
    accepted = [r for r in results if r[1] == 202]
    rejected = [r for r in results if r[1] in (429, 503)]
    reasons = Counter(r[3]["reason"] for r in rejected)
    # Refusals start at lag_soft (reject mode) or when blocking cannot help (block mode):
    # the reaction is measured from the first lag reading at or over lag_soft.
    crossing = next((t for t, lag in samples if lag >= soft), None)
    first_refusal = min((r[0] + r[2] for r in rejected), default=None)
    latencies = [r[2] for r in results]
    return {
        "seconds": seconds,
        "lag_soft": soft,
        "lag_hard": hard,
        "offered": len(results),
        "accepted": len(accepted),
        "blocked_then_accepted": len(blocked),
        "rejected": len(rejected),
        "rejected_by_reason": dict(reasons),
        "submit_p50_ms": percentile(latencies, 0.5) * 1000,
        "submit_p99_ms": percentile(latencies, 0.99) * 1000,
        "max_lag_seen": max((lag for _, lag in samples), default=0),
        "lag_over_time": samples[::4],
        "drained_per_s": len(accepted) / seconds,
        "lag_soft_reading_at_s": crossing,
        "first_refusal_at_s": first_refusal,
        "reaction_s": None
        if crossing is None or first_refusal is None
        else first_refusal - crossing,
    }


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--burst-s", type=float, default=30.0, help="each burst's length")
    parser.add_argument("--join-s", type=float, default=6.0, help="wait for the worker to join")
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few seconds")
    parser.add_argument("--out", type=Path, default=None, help="default docs/bench/admission.json")
    return parser


async def run(args: argparse.Namespace) -> dict[str, Any]:
    async with services() as (admin, bootstrap):
        hepta = await heptamini(admin, bootstrap)
        print("heptamini:", json.dumps(hepta, indent=1))
        floods = {}
        for mode in ("reject", "block"):
            floods[mode] = await burst(admin, bootstrap, mode, args.burst_s, args.join_s)
            shown = {k: v for k, v in floods[mode].items() if k != "lag_over_time"}
            print(f"burst ({mode} mode):", json.dumps(shown, indent=1))
    return {"heptamini": hepta, "burst": floods}


def headline(report: dict[str, Any]) -> dict[str, Any]:
    hepta, reject = report["heptamini"], report["burst"]["reject"]
    block = report["burst"]["block"]
    offered = hepta["accepted"] + hepta["yielded"]
    return {
        "heptamini: accepted / offered": f"{hepta['accepted']} / {offered}",
        "burst (reject): max lag / lag_soft": round(reject["max_lag_seen"] / reject["lag_soft"], 2),
        "burst (block): max lag / lag_soft": round(block["max_lag_seen"] / block["lag_soft"], 2),
        "burst (reject): submit p99 ms": round(reject["submit_p99_ms"], 1),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parser().parse_args(argv)
    if args.quick:
        args.burst_s, args.join_s = min(args.burst_s, 3.0), min(args.join_s, 3.0)
    logging.basicConfig(level=logging.ERROR)
    report = asyncio.run(run(args))
    out = args.out or (None if args.quick else OUT)
    if out is not None:
        write_report(report, out, lambda png: plot_admission(report, path=png))
    return report


if __name__ == "__main__":
    main()
