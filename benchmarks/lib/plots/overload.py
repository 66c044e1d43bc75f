"""The overload benchmark's plot: goodput over time and the decode tokens wasted, Sluicegate
against the naive pipeline."""

from __future__ import annotations

from pathlib import Path

from benchmarks.lib.plots import pyplot, save

BIN_S = 5.0

# (finished at, seconds from the start; useful: finished by its deadline for a caller still
# there; decode tokens it took)
Done = tuple[float, bool, int]


def _rate(done: list[Done], horizon: float) -> tuple[list[float], list[float]]:
    bins = int(horizon // BIN_S) + 1
    counts = [0] * bins
    for at, ok, _ in done:
        if ok:
            counts[min(int(at // BIN_S), bins - 1)] += 1
    return [i * BIN_S + BIN_S / 2 for i in range(bins)], [c / BIN_S for c in counts]


def _wasted(done: list[Done]) -> tuple[list[float], list[float]]:
    xs, ys, total = [0.0], [0.0], 0
    for at, ok, tokens in sorted(done):
        if not ok:
            total += tokens
            xs.append(at)
            ys.append(total / 1000)
    return xs, ys


def plot_overload(
    capacity: float, *, sluicegate_done: list[Done], naive_done: list[Done], path: Path
) -> None:
    plt = pyplot()
    horizon = max(at for at, _, _ in sluicegate_done + naive_done)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
    for label, done, style in (("Sluicegate", sluicegate_done, "-"), ("naive", naive_done, "--")):
        top.plot(*_rate(done, horizon), style, label=label)
        bottom.plot(*_wasted(done), style, label=label)
    top.axhline(capacity, color="grey", linewidth=0.8, label="engine capacity")
    top.set_ylabel(f"jobs finished by their deadline / s ({BIN_S:.0f} s bins)")
    top.set_title("3x overload with deadlines, 10 % of callers cancel or leave")
    top.legend()
    bottom.set_ylabel("wasted decode tokens (thousands, cumulative)")
    bottom.set_xlabel("seconds from the first arrival")
    bottom.legend()
    save(fig, path)
