"""Fleet: 64 simulated GPU workers in one consumer group through a burst and a rebalance
storm, once for each group configuration (eager, static membership with and without an
explicit leave, the consumer protocol of KIP-848), with the same arrivals.

What it measures and how, and why it is simulated so: docs/benchmarks.md#fleet. Not part
of ``python -m benchmarks`` (it runs only with ``--only fleet``).

    python -m benchmarks.scenarios.fleet [--workers 64] [--configs eager consumer] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from pathlib import Path
from typing import Any

from benchmarks.lib.fleet.configs import CONFIGS
from benchmarks.lib.fleet.plan import MIX, SEED, Plan, Roofline, plan, roofline
from benchmarks.lib.fleet.run import raise_max_connections, run_config
from benchmarks.lib.greedy import GATES
from benchmarks.lib.plots.fleet import plot_fleet
from benchmarks.lib.reports import OUT_DIR, write_report
from benchmarks.lib.stack import broker_kind, services
from plumbing.settings.worker import WorkerSettings
from sluicegate.local.broker.dist import KAFKA_VERSION

OUT = OUT_DIR / "fleet.json"
# The configuration a worker runs with the shipped settings (no instance ids).
DEFAULT = {"classic": "eager", "consumer": "consumer"}[
    WorkerSettings.model_fields["worker_group_protocol"].default
]


async def run(args: argparse.Namespace) -> dict[str, Any]:
    roof = await roofline(args.max_num_seqs)
    fleet_jobs_per_s = args.workers * roof.jobs_per_s / args.time_scale
    service_s = roof.service_s * args.time_scale
    sched = plan(args, fleet_jobs_per_s, service_s)
    print(
        f"roofline: {roof.jobs_per_s:.2f} jobs/s an engine, fleet {fleet_jobs_per_s:.2f} jobs/s "
        f"at time scale {args.time_scale}; service {service_s:.1f}s; {len(sched.arrivals)} "
        "arrivals",
        flush=True,
    )
    runs: dict[str, dict[str, Any]] = {}
    async with services(raise_max_connections) as (admin, bootstrap):
        for name in args.configs:
            runs[name] = await run_config(admin, bootstrap, CONFIGS[name], args, roof, sched)
            print(f"{name}: {runs[name]['summary']}", flush=True)
    return {
        "config": config(args, roof, sched, fleet_jobs_per_s, service_s),
        "summary": {name: r["summary"] for name, r in runs.items()},
        "runs": runs,
    }


def config(
    args: argparse.Namespace,
    roof: Roofline,
    sched: Plan,
    fleet_jobs_per_s: float,
    service_s: float,
) -> dict[str, Any]:
    return {
        "workers": args.workers,
        "partitions": args.partitions,
        "time_scale": args.time_scale,
        "max_num_seqs": args.max_num_seqs,
        "engine_model": "simulator: Llama 8B on an 80 GB GPU (roofline step times)",
        "engine_roofline_jobs_per_s": round(roof.jobs_per_s, 3),
        "engine_service_s_roofline": round(roof.service_s, 3),
        "fleet_capacity_jobs_per_s_wall": round(fleet_jobs_per_s, 3),
        "service_s_wall": round(service_s, 2),
        "load": args.load,
        "burst": args.burst,
        "rate_jobs_per_s": round(sched.rate, 3),
        "burst_rate_jobs_per_s": round(sched.burst_rate, 3),
        "phases_s": {k: [round(a, 1), round(b, 1)] for k, (a, b) in sched.phases.items()},
        "moves": args.moves,
        "drain_timeout_s": args.drain_s,
        "db_pool_per_worker": args.db_pool,
        "seed": args.seed,
        "mix": MIX.__dict__,
        "policy": args.policy,
        "session_timeout_ms": args.session_ms,
        "configs": {name: CONFIGS[name].about for name in args.configs},
        "default": DEFAULT,
        "broker": f"Apache Kafka {KAFKA_VERSION}" if broker_kind() == "kafka" else "Tansu",
        "workers_as": "asyncio tasks of one process, one consumer, pool and engine each",
        "leader": "the storm's first kill is the group's leader (the consumer protocol has "
        "none: the member the broker names first)",
        "kill": "no heartbeat, no leave, no commit, jobs cancelled, task cancelled: the group "
        "waits for the session timeout (aiokafka: its heartbeat task cancelled and LeaveGroup "
        "disabled; librdkafka: its handle destroyed without the consumer close)",
    }


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--workers", type=int, default=64)
    parser.add_argument("--partitions", type=int, default=128)
    parser.add_argument("--time-scale", type=float, default=10.0, help="x roofline step time")
    parser.add_argument("--max-num-seqs", type=int, default=1, help="each engine's batch")
    parser.add_argument("--load", type=float, default=0.65, help="x fleet capacity")
    parser.add_argument("--burst", type=float, default=3.0, help="x fleet capacity")
    parser.add_argument("--warm-s", type=float, default=40.0)
    parser.add_argument("--burst-s", type=float, default=15.0)
    parser.add_argument("--settle-s", type=float, default=20.0)
    parser.add_argument("--storm-s", type=float, default=60.0)
    parser.add_argument("--tail-s", type=float, default=60.0)
    parser.add_argument("--moves", type=int, default=16, help="leaves (and joins) in the storm")
    # Well within the 10 s the embedded broker gives a member to rejoin a rebalance (a
    # member still draining after that is expelled, and its rejoin is one more rebalance).
    parser.add_argument("--drain-s", type=float, default=4.0, help="a worker's drain timeout")
    parser.add_argument("--db-pool", type=int, default=2, help="each worker's database pool")
    parser.add_argument("--start-max-s", type=float, default=120.0)
    parser.add_argument("--drain-max-s", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument(
        "--policy",
        default="kv",
        choices=list(GATES),
        help="greedy: the baseline of benchmarks/lib/greedy.py",
    )
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    # The classic members' session: the broker's group.consumer.session.timeout.ms.
    parser.add_argument("--session-ms", type=int, default=10_000)
    parser.add_argument("--quick", action="store_true", help="4 workers, a short schedule")
    parser.add_argument("--out", type=Path, default=None, help="default docs/bench/fleet.json")
    return parser


def quick(args: argparse.Namespace) -> None:
    args.workers, args.partitions = min(args.workers, 4), min(args.partitions, 8)
    args.time_scale = min(args.time_scale, 4.0)
    args.warm_s, args.burst_s, args.settle_s = 6.0, 3.0, 2.0
    args.storm_s, args.tail_s, args.moves = 6.0, 2.0, 2
    args.drain_s, args.drain_max_s = 3.0, 15.0


def headline(report: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, s in report["summary"].items():
        out[f"{name}: goodput jobs/s storm (x warm-up)"] = (
            f"{s['goodput_storm_jobs_per_s']} ({s['storm_over_warm']})"
        )
        out[f"{name}: settle s median, duplicates, leader kills"] = (
            f"{s['settle_s_median']}, {s['duplicates']}, {s['leader_kills']}"
        )
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parser().parse_args(argv)
    if broker_kind() != "kafka":
        raise SystemExit(
            "the fleet benchmark runs on Apache Kafka: Tansu has no consumer protocol and "
            "cannot re-form a group without its leader, whom the storm kills"
        )
    if args.quick:
        quick(args)
    logging.basicConfig(level=logging.ERROR)
    report = asyncio.run(run(args))
    out = args.out or (None if args.quick else OUT)
    if out is not None:
        write_report(report, out, lambda png: plot_fleet(report, path=png))
    return report


if __name__ == "__main__":
    main()
