"""KV-gated against greedy pull on a real engine: SmolLM2-135M on llama.cpp, on this CPU.

What it measures and how: docs/benchmarks.md#llamacpp_pull. Needs the model (`sluicegate
model pull`).

    python -m benchmarks.scenarios.llamacpp_pull [--jobs N] [--ttl S] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.lib.greedy import GATES
from benchmarks.lib.plots.llamacpp_pull import plot_llamacpp_pull
from benchmarks.lib.reports import OUT_DIR, write_report
from benchmarks.lib.stack import TERMINAL, Bench, pipeline, services
from benchmarks.lib.stack import job_rows as rows_of
from client.samples import sample_documents
from plumbing.settings import Settings
from schemas.tables import jobs
from sluicegate.local import model as models
from sluicegate.local.embedded import free_port

OUT = OUT_DIR / "llamacpp_pull.json"
SAMPLE_S = 0.25
SLOTS = 2


@dataclass(frozen=True)
class Scenario:
    jobs: int = 40
    max_tokens: int = 96
    ttl_s: float = 45.0
    shortest_chars: int = 400
    longest_chars: int = 1600

    def documents(self) -> list[str]:
        samples = [text for _, text in sample_documents()]
        span = self.longest_chars - self.shortest_chars
        return [
            samples[i % len(samples)][: self.shortest_chars + (i * 389) % (span + 1)]
            for i in range(self.jobs)
        ]


@dataclass(frozen=True)
class Sample:
    at: float
    processing: float
    deferred: float
    predicted: float


async def server_metrics(client: httpx.AsyncClient) -> dict[str, float]:
    text = (await client.get("/metrics")).text
    return {
        sample.name.removeprefix("llamacpp:"): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


@contextlib.asynccontextmanager
async def llama_server(model: Path) -> AsyncIterator[str]:
    """`sluicegate llama-server` as a process of its own, as the stack runs it."""
    url = f"http://127.0.0.1:{free_port()}"
    env = {
        **os.environ,
        "SLUICEGATE_LLAMACPP_URL": url,
        "SLUICEGATE_LLAMACPP_MODEL_PATH": str(model),
        "SLUICEGATE_LLAMACPP_SLOTS": str(SLOTS),
    }
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "sluicegate", "llama-server", env=env
    )
    try:
        async with httpx.AsyncClient(base_url=url, timeout=5) as client:
            async with asyncio.timeout(60):
                while (await _health(client)) != 200:
                    if process.returncode is not None:
                        raise RuntimeError(f"llama-server exited with {process.returncode}")
                    await asyncio.sleep(0.1)
        yield url
    finally:
        if process.returncode is None:
            process.terminate()
        await process.wait()


async def _health(client: httpx.AsyncClient) -> int:
    try:
        return (await client.get("/health")).status_code
    except httpx.HTTPError:
        return 0


async def run_policy(
    admin: str, bootstrap: str, policy: str, scenario: Scenario, model: Path
) -> dict[str, Any]:
    async with llama_server(model) as url:
        overrides: dict[str, object] = {
            "engine": "llamacpp",
            "llamacpp_url": url,
            "worker_max_running": SLOTS if policy == "kv" else 100_000,
            "lag_soft": 1_000_000,
            "lag_hard": 2_000_000,
            "deadline_aware": False,
            "partitions": 2,
        }
        async with (
            pipeline(admin, bootstrap, **overrides) as bench,
            httpx.AsyncClient(base_url=url, timeout=5) as server,
        ):
            bench.start_relay()
            for doc in scenario.documents():
                body = {
                    "kind": "summarize",
                    "input": doc,
                    "max_tokens": scenario.max_tokens,
                    "ttl_s": scenario.ttl_s,
                }
                response = await bench.client.post("/v1/jobs", json=body)
                assert response.status_code == 202, response.text
            before = await server_metrics(server)
            start = time.monotonic()
            bench.start_worker(gate_type=GATES[policy])
            samples = await sample_until_done(bench, server, scenario.jobs, start)
            elapsed = time.monotonic() - start
            after = await server_metrics(server)
            rows = await rows_of(
                bench,
                jobs.c.state,
                jobs.c.deadline,
                jobs.c.started_at,
                jobs.c.finished_at,
                jobs.c.result,
                jobs.c.decoded_tokens,
            )
    return summarize_run(policy, samples, rows, elapsed, before, after)


async def sample_until_done(
    bench: Bench, server: httpx.AsyncClient, count: int, start: float
) -> list[Sample]:
    samples: list[Sample] = []
    while True:
        figures = await server_metrics(server)
        samples.append(
            Sample(
                at=round(time.monotonic() - start, 2),
                processing=figures.get("requests_processing", 0.0),
                deferred=figures.get("requests_deferred", 0.0),
                predicted=figures.get("tokens_predicted_total", 0.0),
            )
        )
        if len(samples) % 8 == 0:
            done = await rows_of(bench, jobs.c.state)
            if sum(1 for r in done if r["state"] in TERMINAL) == count:
                return samples
        await asyncio.sleep(SAMPLE_S)


def summarize_run(
    policy: str,
    samples: list[Sample],
    rows: list[dict[str, Any]],
    elapsed: float,
    before: dict[str, float],
    after: dict[str, float],
) -> dict[str, Any]:
    on_time = [r for r in rows if r["state"] == "succeeded" and r["finished_at"] <= r["deadline"]]
    useful = sum(r["result"]["output_tokens"] for r in on_time)
    decoded = after["tokens_predicted_total"] - before["tokens_predicted_total"]
    started = min(r["started_at"] for r in rows if r["started_at"] is not None)
    ended = max(r["finished_at"] for r in rows if r["finished_at"] is not None)
    window = (ended - started).total_seconds()  # first start to last end
    states: dict[str, int] = {}
    for row in rows:
        states[row["state"]] = states.get(row["state"], 0) + 1
    return {
        "policy": policy,
        "jobs": len(rows),
        "states": states,
        "succeeded_on_time": len(on_time),
        "deadline_misses": len(rows) - len(on_time) - states.get("failed", 0),
        "most_deferred_in_server": max(s.deferred for s in samples),
        "mean_deferred_in_server": round(sum(s.deferred for s in samples) / len(samples), 2),
        "most_processing": max(s.processing for s in samples),
        "tokens_decoded_by_server": int(decoded),
        "tokens_for_on_time_jobs": useful,
        "tokens_wasted": int(decoded) - useful,
        "first_start_to_last_end_s": round(window, 1),
        "output_tokens_per_s": round(decoded / window, 1),
        "on_time_output_tokens_per_s": round(useful / window, 1),
        "prompt_tokens_by_server": int(
            after["prompt_tokens_total"] - before["prompt_tokens_total"]
        ),
        "worker_run_s": round(elapsed, 1),
        "timeline": [asdict(s) for s in samples],
    }


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=Scenario.jobs)
    parser.add_argument("--max-tokens", type=int, default=Scenario.max_tokens)
    parser.add_argument("--ttl", type=float, default=Scenario.ttl_s, help="seconds per job")
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few jobs")
    parser.add_argument("--out", type=Path, default=None, help=f"default {OUT}")
    return parser


async def run(scenario: Scenario, model: Path) -> dict[str, Any]:
    report: dict[str, Any] = {"scenario": asdict(scenario), "slots": SLOTS}
    async with services() as (admin, bootstrap):
        for policy in ("kv", "greedy"):
            outcome = await run_policy(admin, bootstrap, policy, scenario, model)
            report[policy] = outcome
            shown = {k: v for k, v in outcome.items() if k != "timeline"}
            print(f"{policy}:", json.dumps(shown, indent=1), flush=True)
    return report


def headline(report: dict[str, Any]) -> dict[str, Any]:
    kv, greedy = report["kv"], report["greedy"]
    return {
        "llama.cpp: most requests deferred in the server, kv / greedy": (
            f"{kv['most_deferred_in_server']:g} / {greedy['most_deferred_in_server']:g}"
        ),
        "llama.cpp: deadline misses, kv / greedy": (
            f"{kv['deadline_misses']} / {greedy['deadline_misses']}"
        ),
        "llama.cpp: on-time output tokens/s, kv / greedy": (
            f"{kv['on_time_output_tokens_per_s']} / {greedy['on_time_output_tokens_per_s']}"
        ),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parser().parse_args(argv)
    scenario = Scenario(jobs=args.jobs, max_tokens=args.max_tokens, ttl_s=args.ttl)
    if args.quick:
        scenario = Scenario(jobs=6, max_tokens=16, ttl_s=60.0)
    model = models.model_path(Settings().data_dir)
    if not model.is_file():
        sys.exit(f"no model at {model}: run `sluicegate model pull` first")
    logging.basicConfig(level=logging.ERROR)
    report = asyncio.run(run(scenario, model))
    report["headline"] = headline(report)
    out = args.out or (None if args.quick else OUT)
    if out is not None:
        write_report(report, out, lambda png: plot_llamacpp_pull(report, path=png))
    return report


if __name__ == "__main__":
    main()
