"""The fleet benchmark's plot: goodput, lag and the partitions served over time, one line
per group configuration, the phases shaded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.lib.plots import pyplot, save

STYLES = {
    "eager": ("--", "#d62728"),
    "static": (":", "#ff7f0e"),
    "static-leave": ("-.", "#9467bd"),
    "consumer": ("-", "#1f77b4"),
    "consumer-static": ("-", "#2ca02c"),
}
SHADES = {"burst": "#fdd49e", "storm": "#d9d9d9"}
SMOOTH_S = 5


def _mean(values: list[float], width: int) -> list[float]:
    return [sum(values[max(0, i - width + 1) : i + 1]) / width for i in range(len(values))]


def plot_fleet(report: dict[str, Any], *, path: Path) -> None:
    plt = pyplot()
    config = report["config"]
    fig, (good, lag, alive) = plt.subplots(3, 1, figsize=(10, 9), sharex=True)
    for axis in (good, lag, alive):
        for name, color in SHADES.items():
            start, end = config["phases_s"][name]
            axis.axvspan(start, end, color=color, alpha=0.5, linewidth=0)
    for policy, run in report["runs"].items():
        style, color = STYLES.get(policy, ("-", "#2ca02c"))
        seconds = [g[0] for g in run["goodput_per_s"]]
        jobs = _mean([g[1] for g in run["goodput_per_s"]], SMOOTH_S)
        good.plot(seconds, jobs, style, color=color, label=policy)
        at = [s["at_s"] for s in run["samples"]]
        lag.plot(at, [s["lag"] for s in run["samples"]], style, color=color, label=policy)
        alive.plot(at, [s["served"] for s in run["samples"]], style, color=color, label=policy)
    good.axhline(config["fleet_capacity_jobs_per_s_wall"], color="grey", linewidth=0.8)
    good.set_ylabel(f"jobs succeeded / s ({SMOOTH_S} s mean)")
    good.set_title(
        f"{config['workers']} simulated GPUs in one group: burst (orange), "
        f"rebalance storm (grey); capacity line"
    )
    lag.set_ylabel("lag (admission's reading, jobs)")
    alive.set_ylabel("partitions served")
    alive.set_xlabel("seconds from the first arrival")
    for axis in (good, lag, alive):
        axis.legend(fontsize=8)
    save(fig, path)
