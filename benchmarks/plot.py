"""Plots of the benchmark figures (matplotlib: the ``plots`` extra, in ``bench`` and ``dev``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_ingress(result: dict[str, Any], *, path: Path) -> None:
    """Accepted jobs/s, and p50/p99 latency of a request (alone and loaded), Sluicegate
    beside Celery."""
    plt = _pyplot()
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
    _save(fig, path)


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path) -> None:
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)


def plot_admission(report: dict[str, Any], *, path: Path) -> None:
    """The burst: the worker group's lag over time in each mode against lag_soft and
    lag_hard, and how the offered submissions ended."""
    plt = _pyplot()
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
    _save(fig, path)


def plot_kv_pull(results: dict[str, Any], *, path: Path) -> None:
    """KV cache usage over time, KV-gated against greedy pull, one panel per scenario."""
    plt = _pyplot()
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
    _save(fig, path)


def plot_llamacpp_pull(report: dict[str, Any], *, path: Path) -> None:
    """llama.cpp under each pull policy: requests deferred in the server and busy slots over
    time, and output tokens decoded (on time and in all)."""
    plt = _pyplot()
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
    _save(fig, path)


def plot_longpoll(latencies_ms: dict[str, list[float]], *, path: Path) -> None:
    """How soon a long-poll answers after the terminal write: the CDF of each shape."""
    plt = _pyplot()
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
    _save(fig, path)


def plot_scale_out(runs: list[dict[str, Any]], *, path: Path) -> None:
    """Throughput by the number of workers against linear, and the ratio to linear."""
    plt = _pyplot()
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
    _save(fig, path)


def plot_soak(samples: list[dict[str, Any]], *, path: Path) -> None:
    """The soak: each process's RSS over time, and the submit latency and answers."""
    plt = _pyplot()
    fig, (rss, submit) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    minutes = [s["at_s"] / 60 for s in samples]
    roles = sorted({role for s in samples for role in s["rss_mb"]})
    for role in roles:
        rss.plot(minutes, [s["rss_mb"].get(role) for s in samples], label=role)
    rss.set_ylabel("RSS (MiB)")
    rss.set_title("Memory of each process")
    rss.legend(fontsize=8)
    submit.plot(minutes, [s["submit_p50_ms"] for s in samples], label="submit p50 (ms)")
    submit.plot(minutes, [s["submit_p99_ms"] for s in samples], label="submit p99 (ms)")
    submit.set_yscale("log")
    submit.set_ylabel("ms")
    answers = submit.twinx()
    answers.plot(minutes, [s["accepted_per_s"] for s in samples], "g--", label="accepted / s")
    answers.plot(minutes, [s["refused_per_s"] for s in samples], "r--", label="refused / s")
    answers.set_ylabel("submissions / s")
    submit.set_xlabel("minutes")
    submit.legend(loc="upper left", fontsize=8)
    answers.legend(loc="upper right", fontsize=8)
    _save(fig, path)
