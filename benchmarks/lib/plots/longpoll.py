"""The long-poll benchmark's plot: how soon a waiter is answered, as a CDF."""

from __future__ import annotations

from pathlib import Path

from benchmarks.lib.plots import pyplot, save


def plot_longpoll(latencies_ms: dict[str, list[float]], *, path: Path) -> None:
    """How soon a long-poll answers after the terminal write: the CDF of each shape."""
    plt = pyplot()
    fig, axes = plt.subplots(figsize=(7, 4))
    for name, values in latencies_ms.items():
        ordered = sorted(values)
        shares = [(i + 1) / len(ordered) for i in range(len(ordered))]
        axes.step(ordered, shares, where="post", label=name.replace("_", " "))
    axes.set_xscale("log")
    plain = plt.FuncFormatter(lambda v, _: f"{v:g}")
    axes.xaxis.set_major_formatter(plain)
    axes.xaxis.set_minor_formatter(plain)
    axes.set_xlabel("ms from the commit of the terminal write to the answer")
    axes.set_ylabel("share of waiters answered")
    axes.legend(fontsize=8)
    save(fig, path)
