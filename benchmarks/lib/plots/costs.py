"""The costs benchmark's plot: CPU milliseconds per accepted job by process, and
PostgreSQL's work per job, by window."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.lib.plots import pyplot, save

PROCESSES = ("api", "relay", "worker", "webhooks", "postgres", "broker")
PG_FIGURES = (
    ("statements", "statements", 1.0),
    ("transactions", "transactions", 1.0),
    ("rows written", "rows_written", 1.0),
    ("WAL KiB", "wal_bytes", 1 / 1024),
)


def plot_costs(report: dict[str, Any], *, path: Path) -> None:
    plt = pyplot()
    gross: dict[str, Any] = report["per_job_by_window"]
    net: dict[str, Any] = report["per_job_net_of_idle_by_window"]
    names = list(gross)
    width = 0.8 / max(1, len(names))
    fig, (cpu, pg) = plt.subplots(1, 2, figsize=(13, 5), gridspec_kw={"width_ratios": [3, 2]})

    for i, name in enumerate(names):
        xs = [p + (i - (len(names) - 1) / 2) * width for p in range(len(PROCESSES))]
        color = f"C{i}"
        cpu.bar(
            xs,
            [gross[name]["cpu_ms"][p] for p in PROCESSES],
            width,
            color=color,
            alpha=0.35,
            label=f"{name} (gross)",
        )
        cpu.bar(
            xs,
            [max(0.0, net[name]["cpu_ms"][p]) for p in PROCESSES],
            width * 0.6,
            color=color,
            label=f"{name} (net of idle)",
        )
    cpu.set_xticks(range(len(PROCESSES)), PROCESSES)
    cpu.set_ylabel("CPU ms per accepted job")
    cpu.set_title(f"CPU per job at {report['config']['rate_jobs_per_s']} jobs/s")
    cpu.legend(fontsize=8)
    cpu.grid(axis="y", alpha=0.3)

    for i, name in enumerate(names):
        xs = [p + (i - (len(names) - 1) / 2) * width for p in range(len(PG_FIGURES))]
        values = [gross[name]["pg"][key] * scale for _, key, scale in PG_FIGURES]
        pg.bar(xs, values, width, color=f"C{i}", label=name)
    pg.set_xticks(range(len(PG_FIGURES)), [label for label, _, _ in PG_FIGURES])
    pg.set_title("PostgreSQL per job (gross)")
    pg.legend(fontsize=8)
    pg.grid(axis="y", alpha=0.3)

    fig.suptitle("Sluicegate: measured cost per accepted job (simulator engine)")
    save(fig, path)
