"""The admission benchmark's plot: the lag through a burst and how the submissions ended."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.lib.plots import pyplot, save


def plot_admission(report: dict[str, Any], *, path: Path) -> None:
    """The burst: the worker group's lag over time in each mode against lag_soft and
    lag_hard, and how the offered submissions ended."""
    plt = pyplot()
    bursts: dict[str, dict[str, Any]] = report["burst"]
    fig, (lag, ends) = plt.subplots(1, 2, figsize=(12, 4.5))
    for mode, run in bursts.items():
        points = run["lag_over_time"]
        lag.plot([t for t, _ in points], [v for _, v in points], label=f"{mode} mode")
    first = next(iter(bursts.values()))
    for name in ("lag_soft", "lag_hard"):
        if first.get(name) is not None:
            lag.axhline(first[name], color="grey", linestyle=":", linewidth=0.8)
            lag.annotate(name, (0, first[name]), fontsize=8, va="bottom")
    lag.set_xlabel("seconds into the burst")
    lag.set_ylabel("lag (records)")
    lag.set_title("Lag stays under the thresholds")
    lag.legend()
    reasons = sorted({r for run in bursts.values() for r in run["rejected_by_reason"]})
    xs = list(range(len(bursts)))
    bottom = [float(run["accepted"]) for run in bursts.values()]
    ends.bar(xs, bottom, label="accepted")
    for reason in reasons:
        counts = [float(run["rejected_by_reason"].get(reason, 0)) for run in bursts.values()]
        ends.bar(xs, counts, bottom=bottom, label=f"refused: {reason}")
        bottom = [b + c for b, c in zip(bottom, counts, strict=True)]
    ends.set_xticks(xs, [f"{mode} mode" for mode in bursts])
    ends.set_ylabel("submissions")
    ends.set_title("How the offered submissions ended")
    ends.legend(fontsize=8)
    save(fig, path)
