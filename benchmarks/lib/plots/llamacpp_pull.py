"""The llama.cpp pull benchmark's plot: requests deferred in the server, tokens decoded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.lib.plots import pyplot, save


def plot_llamacpp_pull(report: dict[str, Any], *, path: Path) -> None:
    """llama.cpp under each pull policy: requests deferred in the server and busy slots over
    time, and output tokens decoded (on time and in all)."""
    plt = pyplot()
    fig, (queue, tokens) = plt.subplots(1, 2, figsize=(12, 4.2))
    for policy, style in (("kv", "-"), ("greedy", "--")):
        timeline = report[policy]["timeline"]
        at = [s["at"] for s in timeline]
        queue.plot(at, [s["deferred"] for s in timeline], style, label=f"{policy}: deferred")
        queue.plot(
            at, [s["processing"] for s in timeline], style, alpha=0.5, label=f"{policy}: processing"
        )
        tokens.plot(
            at,
            [s["predicted"] - timeline[0]["predicted"] for s in timeline],
            style,
            label=f"{policy} ({report[policy]['deadline_misses']} deadline misses)",
        )
    queue.set_xlabel("seconds from the worker's start")
    queue.set_ylabel("requests in the llama.cpp server")
    queue.legend(fontsize=8)
    tokens.set_xlabel("seconds from the worker's start")
    tokens.set_ylabel("output tokens decoded")
    tokens.legend(fontsize=8)
    save(fig, path)
