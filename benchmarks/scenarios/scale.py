"""Scale: the measured per-job costs and the fleet simulation, and what they say about a fleet
of ``--gpus`` GPUs taking ``--jobs-per-s`` jobs a second (1,000 and 10,000 by default).

How it derives them (``derive``, written out beside each number in docs/scaling.md):
docs/benchmarks.md#scale. Not part of ``python -m benchmarks`` (only with ``--only scale``).

    python -m benchmarks.scenarios.scale [--from-reports] [--quick] [--gpus 1000]
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.lib.reports import OUT_DIR, write_report

ROOT = Path(__file__).resolve().parents[2]
OUT = OUT_DIR / "scale.json"
ROLES = ("api", "relay", "webhooks")  # stateless: scaled by process count
DAY_S = 86_400


def load_report(name: str, out_dir: Path = OUT_DIR) -> dict[str, Any]:
    path = out_dir / f"{name}.json"
    try:
        report: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        raise SystemExit(
            f"{path} is missing: run python -m benchmarks.scenarios.{name} first"
        ) from None
    return report


def gpu_capacity(scale_out: dict[str, Any]) -> float:
    """Jobs/s one simulated GPU finishes at its roofline time (the one-worker run of the
    scale-out benchmark, in wall seconds x its time scale)."""
    one = next(r for r in scale_out["runs"] if r["workers"] == 1)
    return float(one["jobs_per_s"]) * float(scale_out["config"]["time_scale"])


def derive(
    costs: dict[str, Any],
    relay_rate: dict[str, Any],
    *,
    gpus: int,
    jobs_per_s: float,
    retention_s: float,
    outbox_retention_s: float,
    gpu_jobs_per_s: float,
    callback_share: float,
    core_target: float = 0.6,
) -> dict[str, Any]:
    """What ``jobs_per_s`` over ``gpus`` needs, a ``callback_share`` of the jobs with a
    webhook callback, from the marginal per-job costs (the costs scenario, net of idle), one
    relay's saturated rate (the relay_rate scenario) and one GPU's capacity."""
    job = costs["per_job_net_of_idle"]
    hook = job["webhook_delivery"]
    cpu, pg = job["cpu_ms"], job["pg"]
    outbox_rows = pg["rows_by_table_op"]["outbox"]["ins"]  # records a job publishes
    api_ms = cpu["api"]
    webhooks_ms = cpu["webhooks"] + callback_share * hook["cpu_ms_webhooks"]
    relay = relay_rate["relay"]
    relay_rows_per_s = relay["rows_per_s"]
    per_gpu = jobs_per_s / gpus
    rate = Rate(jobs_per_s, callback_share)
    pg_cores = rate.with_hook(cpu["postgres"], hook["detail"]["cpu_ms"]["postgres"]) / 1000
    return {
        "target": {
            "gpus": gpus,
            "jobs_per_s": jobs_per_s,
            "callback_share": callback_share,
            "core_target": core_target,
        },
        "processes": {
            "api": math.ceil(jobs_per_s * api_ms / 1000 / core_target),
            # A relay is bound by round trips, not CPU: its saturated rate at that share.
            "relay": math.ceil(jobs_per_s * outbox_rows / (relay_rows_per_s * core_target)),
            "webhooks": math.ceil(jobs_per_s * webhooks_ms / 1000 / core_target),
        },
        "cores": {
            "api": round(jobs_per_s * api_ms / 1000, 1),
            "relay": round(jobs_per_s * outbox_rows * relay["cpu_ms_per_row"] / 1000, 1),
            "webhooks": round(jobs_per_s * webhooks_ms / 1000, 1),
            "workers": round(jobs_per_s * cpu["worker"] / 1000, 1),
            "postgres": round(pg_cores, 1),
            "broker": round(jobs_per_s * cpu["broker"] / 1000, 1),
        },
        "gpu": {
            "jobs_per_s_each": round(per_gpu, 2),
            "capacity_jobs_per_s_each": round(gpu_jobs_per_s, 2),
            "utilization": round(per_gpu / gpu_jobs_per_s, 3),
            "worker_cores_each": round(per_gpu * cpu["worker"] / 1000, 3),
        },
        "postgres": postgres(costs, rate, retention_s, outbox_retention_s, pg_cores),
        "kafka": {
            "records_per_s": {
                t: round(jobs_per_s * n) for t, n in job["kafka"]["records"].items() if n
            },
            "mib_per_s": {
                t: round(jobs_per_s * b / 2**20, 2) for t, b in job["kafka"]["bytes"].items() if b
            },
            "dispatch_partitions_at_least": gpus,
        },
    }


@dataclass(frozen=True)
class Rate:
    jobs_per_s: float
    callback_share: float

    def with_hook(self, per_job: float, per_delivery: float) -> float:
        """A second's worth of a per-job figure, its webhook delivery's added for the share
        of the jobs with a callback."""
        return self.jobs_per_s * (per_job + self.callback_share * per_delivery)


def postgres(
    costs: dict[str, Any],
    rate: Rate,
    retention_s: float,
    outbox_retention_s: float,
    cores: float,
) -> dict[str, Any]:
    """PostgreSQL's load a second and its size once the retention window is full."""
    job = costs["per_job_net_of_idle"]
    hook, pg, widths = job["webhook_delivery"], job["pg"], costs["row_widths"]
    outbox_rows = pg["rows_by_table_op"]["outbox"]["ins"]
    jobs_per_s, callback_share = rate.jobs_per_s, rate.callback_share
    window_jobs = jobs_per_s * retention_s
    kept = widths["jobs"]["bytes_per_row"] + callback_share * (
        widths["webhook_deliveries"]["bytes_per_row"] + widths["webhook_attempts"]["bytes_per_row"]
    )
    outbox_bytes = jobs_per_s * outbox_rows * outbox_retention_s * widths["outbox"]["bytes_per_row"]
    wal = rate.with_hook(pg["wal_bytes"], hook["wal_bytes"])
    return {
        "statements_per_s": round(rate.with_hook(pg["statements"], hook["pg_statements"])),
        "commits_per_s": round(rate.with_hook(pg["transactions"], hook["pg_transactions"])),
        "rows_written_per_s": round(rate.with_hook(pg["rows_written"], hook["rows_written"])),
        "wal_mib_per_s": round(wal / 2**20, 1),
        "wal_tib_per_day": round(wal * DAY_S / 2**40, 2),
        "cores": round(cores, 1),
        "jobs_kept": round(window_jobs),
        "bytes_kept_per_job": round(kept),
        "size_tib_at_window": round((window_jobs * kept + outbox_bytes) / 2**40, 2),
    }


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gpus", type=int, default=1000)
    parser.add_argument("--jobs-per-s", type=float, default=10_000.0)
    parser.add_argument("--retention-days", type=float, default=7.0, help="retention_ended_s")
    parser.add_argument("--outbox-hours", type=float, default=1.0, help="retention_outbox_s")
    parser.add_argument("--core-target", type=float, default=0.6, help="a process's CPU share")
    parser.add_argument(
        "--from-reports",
        action="store_true",
        help="read docs/bench/costs.json, relay_rate.json and fleet.json instead of running",
    )
    parser.add_argument("--quick", action="store_true", help="quick runs of all, not written")
    parser.add_argument("--out", type=Path, default=None, help="default docs/bench/scale.json")
    return parser


def measured(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The costs, relay rate and fleet reports: run now, or read from docs/bench."""
    names = ("costs", "relay_rate", "fleet")
    if args.from_reports:
        return {name: load_report(name) for name in names}
    if not args.quick:
        return {name: run_scenario(name, [], OUT_DIR) for name in names}
    with tempfile.TemporaryDirectory(prefix="sluicegate-scale-") as tmp:
        return {name: run_scenario(name, ["--quick"], Path(tmp)) for name in names}


def run_scenario(name: str, argv: list[str], out_dir: Path) -> dict[str, Any]:
    """``python -m benchmarks.scenarios.NAME`` as a process of its own (a scenario never
    imports another), writing its report to ``out_dir``, which is read back."""
    command = [sys.executable, "-m", f"benchmarks.scenarios.{name}", *argv]
    command += ["--out", str(out_dir / f"{name}.json")]
    sys.stdout.flush()
    subprocess.run(command, check=True, cwd=ROOT)
    return load_report(name, out_dir)


def show(report: dict[str, Any]) -> None:
    print("\nper accepted job, net of idle (the costs scenario):")
    job = report["per_job"]
    print("  CPU ms: " + ", ".join(f"{k} {v:.2f}" for k, v in job["cpu_ms"].items()))
    pg = job["pg"]
    print(
        f"  PostgreSQL: {pg['statements']:.1f} statements, {pg['transactions']:.1f} commits,"
        f" {pg['rows_written']:.1f} rows, {pg['wal_bytes'] / 1024:.1f} KiB WAL"
    )
    hook = job["webhook_delivery"]
    print(
        f"  a webhook delivery adds: {hook['cpu_ms_webhooks']:.2f} CPU ms in the dispatcher,"
        f" {hook['pg_statements']:.1f} statements, {hook['wal_bytes'] / 1024:.1f} KiB WAL"
    )
    print(f"  one relay, saturated: {report['relay']['rows_per_s']:,.0f} rows/s")
    for name, d in report["derived"].items():
        t = d["target"]
        print(f"\n== {t['gpus']:,} GPUs at {t['jobs_per_s']:,.0f} jobs/s, {name}")
        print("  processes at " + f"{t['core_target']:.0%} of a core: {d['processes']}")
        print(f"  cores: {d['cores']}")
        print(f"  GPU: {d['gpu']}")
        print(f"  PostgreSQL: {d['postgres']}")
        print(f"  Kafka: {d['kafka']}")
    print("\nfleet simulation (the fleet scenario):")
    for config, figures in report["fleet"].items():
        print(f"  {config}: {figures}")
    print(f"  plots: {OUT_DIR / 'fleet.png'}, {OUT_DIR / 'costs.png'}")


def headline(report: dict[str, Any]) -> dict[str, Any]:
    d = report["derived"]["a callback per job"]
    return {
        "api replicas": d["processes"]["api"],
        "relays": d["processes"]["relay"],
        "webhook dispatchers": d["processes"]["webhooks"],
        "postgres WAL MiB/s": d["postgres"]["wal_mib_per_s"],
        "postgres TiB at window": d["postgres"]["size_tib_at_window"],
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parser().parse_args(argv)
    reports = measured(args)
    gpu = gpu_capacity(load_report("scale_out"))
    derived = {
        name: derive(
            reports["costs"],
            reports["relay_rate"],
            gpus=args.gpus,
            jobs_per_s=args.jobs_per_s,
            retention_s=args.retention_days * DAY_S,
            outbox_retention_s=args.outbox_hours * 3600,
            gpu_jobs_per_s=gpu,
            callback_share=share,
            core_target=args.core_target,
        )
        for name, share in (("no callbacks", 0.0), ("a callback per job", 1.0))
    }
    report = {
        "per_job": reports["costs"]["per_job_net_of_idle"],
        "relay": reports["relay_rate"]["relay"],
        "fleet": reports["fleet"]["summary"],
        "derived": derived,
    }
    show(report)
    out = args.out or (None if args.quick else OUT)
    if out is not None:
        write_report(report, out)
    return report


if __name__ == "__main__":
    main()
