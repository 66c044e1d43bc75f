"""The scale-out benchmark's plot: throughput by worker count against linear."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.lib.plots import pyplot, save


def plot_scale_out(runs: list[dict[str, Any]], *, path: Path) -> None:
    """Throughput by the number of workers against linear, and the ratio to linear."""
    plt = pyplot()
    fig, (rate, ratio) = plt.subplots(1, 2, figsize=(11, 4.2))
    workers = [r["workers"] for r in runs]
    one = runs[0]
    for key, label, color in (
        ("jobs_per_s", "jobs/s", "#1f77b4"),
        ("output_tokens_per_s", "output tokens/s (/100)", "#ff7f0e"),
    ):
        scale = 100.0 if "tokens" in key else 1.0
        rate.plot(workers, [r[key] / scale for r in runs], "o-", color=color, label=label)
        rate.plot(
            workers,
            [n * one[key] / scale / one["workers"] for n in workers],
            ":",
            color=color,
            label=f"linear, {label}",
        )
        ratio.plot(
            workers, [r[f"{key}_ratio_to_linear"] for r in runs], "o-", color=color, label=label
        )
    rate.set_xlabel("workers (simulated GPUs) in one consumer group")
    rate.set_ylabel("throughput")
    rate.set_xticks(workers)
    rate.legend(fontsize=8)
    ratio.axhline(1.0, color="grey", linewidth=0.8)
    ratio.set_ylim(0, 1.2)
    ratio.set_xticks(workers)
    ratio.set_xlabel("workers")
    ratio.set_ylabel("throughput(n) / (n x throughput(1))")
    ratio.legend(fontsize=8)
    save(fig, path)
