"""KV-gated pull against greedy pull, same workload, saturating load.

What it measures and how: docs/benchmarks.md#kv_pull.

    python -m benchmarks.scenarios.kv_pull [--scenario NAME]... [--jobs N] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from benchmarks.lib.greedy import GATES
from benchmarks.lib.plots.kv_pull import plot_kv_pull
from benchmarks.lib.reports import OUT_DIR, percentile
from benchmarks.lib.stack import TERMINAL, Bench, pipeline, services, wait_published
from benchmarks.lib.stack import job_rows as rows_of
from benchmarks.lib.trace import document
from plumbing.metrics import registry
from schemas.constants import M_JOBS_STARTED
from schemas.tables import jobs
from workers.engines.sim.engine import SimEngine
from workers.service import run_worker

OUT = OUT_DIR / "kv_pull.json"


@dataclass(frozen=True)
class Scenario:
    jobs: int
    prompt_tokens: tuple[int, int]
    max_tokens: int
    ttl_s: float

    def documents(self, seed: int = 3) -> list[str]:
        rng = random.Random(seed)
        return [document(rng, rng.randint(*self.prompt_tokens)) for _ in range(self.jobs)]


SCENARIOS = {
    # Long documents, short summaries: prefill (compute) bound.
    "prefill_heavy": Scenario(jobs=800, prompt_tokens=(1000, 3000), max_tokens=256, ttl_s=120),
    # Shorter documents, long summaries (the output is the document up to max_tokens): the
    # decode phase holds the KV cache, which is what binds.
    "decode_heavy": Scenario(jobs=400, prompt_tokens=(300, 1500), max_tokens=1024, ttl_s=150),
}


async def run_policy(
    admin: str, bootstrap: str, policy: str, scenario: Scenario, time_scale: float = 1.0
) -> dict[str, Any]:
    docs = scenario.documents()
    overrides: dict[str, object] = {
        "worker_max_running": 256 if policy == "kv" else 100_000,
        "lag_soft": 1_000_000,
        "lag_hard": 2_000_000,
        "deadline_aware": False,
        "max_input_bytes": 1_000_000,
        "partitions": 4,
    }
    async with pipeline(admin, bootstrap, **overrides) as bench:
        bench.start_relay()
        loaded = time.monotonic()
        for doc in docs:
            body = {
                "kind": "summarize",
                "input": doc,
                "max_tokens": scenario.max_tokens,
                "ttl_s": scenario.ttl_s,
            }
            response = await bench.client.post("/v1/jobs", json=body)
            assert response.status_code == 202, response.text
        await wait_published(bench, len(docs))
        engine = SimEngine(time_scale=time_scale)
        samples: list[Sample] = []
        start = time.monotonic()
        handed = started_jobs()
        worker = asyncio.create_task(
            run_worker(bench.settings, bench.stop, engine=engine, gate_type=GATES[policy])
        )
        bench.tasks.append(worker)
        while True:
            cap = engine.capacity()
            # Saturated while jobs wait, in Kafka (kv) or in the engine's queue (greedy).
            backlog = len(docs) - (started_jobs() - handed) + cap.waiting
            samples.append(
                Sample(
                    time.monotonic() - start,
                    cap.usage,
                    cap.running,
                    cap.waiting,
                    engine.tokens_decoded,
                    backlog > 0,
                )
            )
            if len(samples) % 10 == 0 and await terminal_count(bench) == len(docs):
                break
            await asyncio.sleep(0.1)
        elapsed = time.monotonic() - start
        rows = await job_rows(bench)
    return summarize_run(policy, engine, samples, rows, elapsed, time.monotonic() - loaded)


@dataclass(frozen=True)
class Sample:
    at: float
    usage: float
    running: int
    waiting: int
    decoded: int
    saturated: bool


def started_jobs() -> int:
    """Jobs handed to an engine in this process so far (the worker's own counter)."""
    return int(registry("worker").get_sample_value(M_JOBS_STARTED) or 0)


async def terminal_count(bench: Bench) -> int:
    return sum(1 for row in await job_rows(bench) if row["state"] in TERMINAL)


async def job_rows(bench: Bench) -> list[dict[str, Any]]:
    return await rows_of(
        bench, jobs.c.state, jobs.c.deadline, jobs.c.started_at, jobs.c.finished_at, jobs.c.result
    )


def summarize_run(
    policy: str,
    engine: SimEngine,
    samples: list[Sample],
    rows: list[dict[str, Any]],
    elapsed: float,
    total: float,
) -> dict[str, Any]:
    started = sorted(r["started_at"] for r in rows if r["started_at"] is not None)
    finished = sorted(r["finished_at"] for r in rows if r["finished_at"] is not None)
    window = (finished[-1] - started[0]).total_seconds()
    # The saturated stretch: once the cache first filled up, while work was still waiting.
    filled = next((s.at for s in samples if s.usage >= 0.8), None)
    busy = [s for s in samples if s.saturated and filled is not None and s.at >= filled]
    usage = [s.usage for s in busy]
    busy_s = busy[-1].at - busy[0].at if len(busy) > 1 else 0.0
    output_tokens = sum(r["result"]["output_tokens"] for r in rows if r["result"])
    prompt_tokens = sum(r["result"]["prompt_tokens"] for r in rows if r["result"])
    misses = sum(
        1
        for r in rows
        if r["state"] == "expired" or (r["finished_at"] and r["finished_at"] > r["deadline"])
    )
    return {
        "policy": policy,
        "jobs": len(rows),
        "succeeded": sum(1 for r in rows if r["state"] == "succeeded"),
        "expired_before_decoding": sum(1 for r in rows if r["state"] == "expired"),
        "deadline_misses": misses,
        "preemptions": engine.capacity().preemptions,
        "prompt_tokens": prompt_tokens,
        "output_tokens": output_tokens,
        "first_start_to_last_end_s": round(window, 2),
        "output_tokens_per_s": round(output_tokens / window, 1),
        "all_tokens_per_s": round((prompt_tokens + output_tokens) / window, 1),
        "gpu_s_simulated": round(engine.simulated_s, 2),
        "output_tokens_per_gpu_s": round(engine.tokens_decoded / engine.simulated_s, 1),
        "saturated_s": round(busy_s, 1),
        "saturated_output_tokens_per_s": round((busy[-1].decoded - busy[0].decoded) / busy_s, 1)
        if busy_s > 0
        else None,
        "kv_usage_mean_saturated": round(sum(usage) / len(usage), 4) if usage else None,
        "kv_usage_p10_saturated": round(percentile(usage, 0.10), 4) if usage else None,
        "kv_usage_max": round(max(s.usage for s in samples), 4),
        "most_running": max(s.running for s in samples),
        "most_waiting_in_engine": max(s.waiting for s in samples),
        "kv_usage_each_s": [round(s.usage, 3) for s in samples[::10]],
        "worker_run_s": round(elapsed, 1),
        "run_s_with_loading": round(total, 1),
    }


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scenario", choices=sorted(SCENARIOS), action="append")
    parser.add_argument("--jobs", type=int, default=None, help="override the job count")
    parser.add_argument(
        "--time-scale", type=float, default=1.0, help="times the roofline step time (1: real)"
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few seconds")
    parser.add_argument("--out", type=Path, default=None, help="default docs/bench/kv_pull.json")
    return parser


async def run(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {}
    async with services() as (admin, bootstrap):
        for name in args.scenario or sorted(SCENARIOS, reverse=True):
            scenario = SCENARIOS[name]
            if args.jobs:
                scenario = replace(scenario, jobs=args.jobs)
            results[name] = {"scenario": asdict(scenario), "time_scale": args.time_scale}
            for policy in ("kv", "greedy"):
                outcome = await run_policy(admin, bootstrap, policy, scenario, args.time_scale)
                results[name][policy] = outcome
                shown = {k: v for k, v in outcome.items() if k != "kv_usage_each_s"}
                print(f"{name} / {policy}:", json.dumps(shown, indent=1), flush=True)
            compare(results[name])
    return results


def headline(report: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, result in report.items():
        out[f"{name}: kv / greedy, output tokens per GPU s"] = result.get(
            "kv_over_greedy_output_tokens_per_gpu_s"
        )
        out[f"{name}: preemptions kv / greedy"] = (
            f"{result['kv']['preemptions']} / {result['greedy']['preemptions']}"
        )
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parser().parse_args(argv)
    if args.quick:
        args.jobs, args.time_scale = min(args.jobs or 8, 8), min(args.time_scale, 0.1)
    logging.basicConfig(level=logging.ERROR)
    results = asyncio.run(run(args))
    out = args.out or (None if args.quick else OUT)
    if out is not None:
        write(results, out)
    return results


def compare(result: dict[str, Any]) -> None:
    kv, greedy = result["kv"], result["greedy"]
    for key in ("output_tokens_per_s", "output_tokens_per_gpu_s", "saturated_output_tokens_per_s"):
        if kv[key] and greedy[key]:
            ratio = kv[key] / greedy[key]
            result[f"kv_over_greedy_{key}"] = round(ratio, 4)
            print(f"KV-gated / greedy, {key}: {ratio:.3f}")


def write(results: dict[str, Any], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1, default=str))
    plot_kv_pull(results, path=out.with_suffix(".png"))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
