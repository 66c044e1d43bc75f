"""The costs benchmark's run: the engine's capacity (optional), then the stack as processes on
embedded PostgreSQL with ``pg_stat_statements`` and an embedded broker, and the windows
(idle, single, single with a callback, batch) measured one after another."""

from __future__ import annotations

import os
import platform
import tempfile
import time
from ipaddress import ip_network
from pathlib import Path
from typing import Any

from benchmarks.lib.costs.figures import figures, notes
from benchmarks.lib.costs.observer import observer, postgres_info, row_widths
from benchmarks.lib.costs.options import Options
from benchmarks.lib.costs.windows import Run, prepare, servers, windows_of
from benchmarks.lib.engine import capacity
from benchmarks.lib.processes import Stack
from benchmarks.lib.receivers import Receiver
from benchmarks.lib.sampling import CLOCK_TICKS
from benchmarks.lib.stack import bench_settings
from benchmarks.lib.trace import Mix
from sluicegate.local.embedded import free_port


def overrides(args: Options, token_s: float | None) -> dict[str, object]:
    out: dict[str, object] = {
        "api_port": free_port(),
        "partitions": 4,
        "lag_soft": 500,  # far above the jobs in flight at this load: nothing is refused
        "lag_hard": 600,
        "max_block_ms": 1000,
        "deadline_aware": False,
        "max_input_bytes": 1_000_000,
        "sim_time_scale": args.time_scale,
        "webhook_allow_networks": (ip_network("127.0.0.0/8"),),
        "webhook_retry_schedule_s": (0.0, 1.0, 5.0),
        # Long windows: nothing is pruned in the run (the pruner still runs its queries).
        "retention_outbox_s": 7 * 86_400.0,
        "retention_ended_s": 7 * 86_400.0,
    }
    if token_s is not None:
        out["expected_token_time_s"] = token_s
    return out


async def measure_capacity(args: Options) -> tuple[float | None, float | None]:
    """(jobs/s, decode s per token) of the simulator alone, or (None, None) when skipped."""
    if args.capacity_measure_s <= 0:
        return None, None
    print(f"measuring the engine's capacity (time scale {args.time_scale}) ...", flush=True)
    cap = await capacity(
        Mix(),
        time_scale=args.time_scale,
        warm_s=args.capacity_warm_s,
        measure_s=args.capacity_measure_s,
    )
    return cap.jobs_per_s, cap.decode_s_per_token


async def measure(args: Options) -> dict[str, Any]:
    started = time.monotonic()
    jobs_per_s, token_s = await measure_capacity(args)
    settings_over = overrides(args, token_s)
    receiver = Receiver()
    server = await receiver.serve()
    with tempfile.TemporaryDirectory(prefix="sluicegate-costs-") as tmp:
        async with (
            servers(Path(tmp)) as srv,
            bench_settings(
                srv.admin_url, srv.bootstrap, data_dir=Path(tmp), **settings_over
            ) as settings,
        ):
            stack = Stack(settings, Path(tmp))
            obs = await observer(srv.admin_url, settings.require_database_url())
            parts = settings.topic_partitions()
            names = {
                "dispatch": settings.dispatch_topic,
                "events": settings.events_topic,
                "dead_letter": settings.dead_letter_topic,
            }
            topics = {label: (name, parts[name]) for label, name in names.items()}
            run = Run(settings, stack, srv, obs, receiver, topics, args=args)
            try:
                await prepare(run)
                pg_info = await postgres_info(obs)
                windows = await windows_of(run)
                widths = await row_widths(obs)
            finally:
                await obs.conn.close()
                exits = stack.stop()
                server.close()
    return {
        "config": {
            "rate_jobs_per_s": args.rate,
            "load_s": args.load_s,
            "idle_s": args.idle_s,
            "settle_s": args.settle_s,
            "batch_size": args.batch_size,
            "time_scale": args.time_scale,
            "capacity_jobs_per_s": None if jobs_per_s is None else round(jobs_per_s, 2),
            "load_share_of_capacity": None
            if jobs_per_s is None
            else round(args.rate / jobs_per_s, 3),
            "settings": {k: str(v) for k, v in settings_over.items()},
            "postgres": pg_info,
            "processes": "python -m sluicegate api | relay | worker | webhooks",
            "engine": "simulator (sleeps its decode steps: the worker's CPU is Sluicegate's own)",
            "run_s": round(time.monotonic() - started, 1),
        },
        "machine": {
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "clock_ticks_per_s": CLOCK_TICKS,
        },
        **figures(windows),
        "notes": notes(windows),
        "row_widths": widths,
        "windows": windows,
        "exit_codes": exits,
    }
