"""The KV-pull benchmark's plot: KV cache usage over time, KV-gated against greedy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.lib.plots import pyplot, save


def plot_kv_pull(results: dict[str, Any], *, path: Path) -> None:
    """KV cache usage over time, KV-gated against greedy pull, one panel per scenario."""
    plt = pyplot()
    fig, panels = plt.subplots(len(results), 1, figsize=(8, 3.2 * len(results)), squeeze=False)
    for axes, (name, result) in zip(panels[:, 0], results.items(), strict=True):
        for policy, style in (("kv", "-"), ("greedy", "--")):
            usage = result[policy]["kv_usage_each_s"]
            label = f"{policy} ({result[policy]['preemptions']} preemptions)"
            axes.plot(range(len(usage)), usage, style, label=label)
        axes.set_ylim(0, 1.05)
        axes.set_ylabel("KV blocks in use")
        axes.set_title(name)
        axes.legend(fontsize=8)
    panels[-1, 0].set_xlabel("seconds from the worker's start")
    save(fig, path)
