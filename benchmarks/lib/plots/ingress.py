"""The ingress benchmark's plot: accepted jobs/s and the latency of a request."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.lib.plots import pyplot, save


def plot_ingress(result: dict[str, Any], *, path: Path) -> None:
    """Accepted jobs/s, and p50/p99 latency of a request (alone and loaded), Sluicegate
    beside Celery."""
    plt = pyplot()
    fig, (rate, latency) = plt.subplots(1, 2, figsize=(13, 5))

    def axis(axes: Any, rows: dict[str, Any]) -> tuple[list[int], list[str]]:
        xs = list(range(len(rows)))
        labels = [n.replace(", ", ",\n").replace(" POST", "\nPOST") for n in rows]
        axes.set_xticks(xs, labels, fontsize=7)
        return xs, ["#999999" if n.startswith("Celery") else "#1f77b4" for n in rows]

    compared: dict[str, dict[str, Any]] = result["compared"]
    xs, colors = axis(rate, compared)
    bars = rate.bar(xs, [r["jobs_per_s"] for r in compared.values()], color=colors)
    rate.bar_label(bars, fmt="%.0f")
    rate.set_ylabel("accepted jobs / s")
    rate.set_title("Throughput (higher is better)")
    rows: dict[str, dict[str, Any]] = result["latency"]
    xs, colors = axis(latency, rows)
    width = 0.38
    p50 = [r.get("p50_ms", 0) for r in rows.values()]
    p99 = [r.get("p99_ms", 0) for r in rows.values()]
    latency.bar([x - width / 2 for x in xs], p50, width, color=colors)
    latency.bar([x + width / 2 for x in xs], p99, width, color=colors, alpha=0.5)
    latency.set_yscale("log")
    latency.set_ylabel("ms per request (a batch is one request)")
    latency.set_title("Latency of one request: p50 (solid), p99 (light)")
    fig.suptitle(result.get("machine", ""), fontsize=9)
    save(fig, path)
