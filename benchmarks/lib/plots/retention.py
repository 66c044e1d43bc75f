"""The retention benchmark's plot: the database's size over time, the rows each table holds,
and what is pruned from it each second."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.lib.plots import pyplot, save

MIB = 1024 * 1024
RATE_SPAN_S = 30.0
TABLES = ("jobs", "outbox", "batches", "webhook_deliveries", "webhook_attempts", "dead_letters")


def _rate(
    minutes: list[float], values: list[float], span_s: float = RATE_SPAN_S
) -> tuple[list[float], list[float]]:
    """Per-second rates over the last ``span_s`` (or more) at each sample: the pruner's
    passes every few seconds would alias with samples every few seconds."""
    xs, ys = [], []
    j = 0
    for i in range(len(values)):
        while j + 1 < i and (minutes[i] - minutes[j + 1]) * 60 >= span_s:
            j += 1
        took_s = (minutes[i] - minutes[j]) * 60
        if took_s >= span_s:
            xs.append(minutes[i])
            ys.append((values[i] - values[j]) / took_s)
    return xs, ys


def plot_retention(report: dict[str, Any], *, path: Path) -> None:
    plt = pyplot()
    samples: list[dict[str, Any]] = report["samples"]
    cfg = report["config"]
    window_min = cfg["window_reached_s"] / 60
    minutes = [s["at_s"] / 60 for s in samples]
    fig, (size, rows, pruned) = plt.subplots(3, 1, figsize=(9, 10), sharex=True)

    size.plot(minutes, [s["database_bytes"] / MIB for s in samples], "k-", lw=2, label="database")
    for name in TABLES:
        size.plot(
            minutes,
            [s["tables"][name]["total"] / MIB if name in s["tables"] else None for s in samples],
            label=name,
        )
    grew = report["growth_after_window"].get("database", {})
    size.set_title(
        f"Retention: outbox {cfg['retention_outbox_s']:g} s, ended {cfg['retention_ended_s']:g} s,"
        f" pruned every {cfg['prune_interval_s']:g} s; {report['load']['accepted_jobs_per_s']} "
        f"jobs/s; growth after the window {grew.get('growth_pct')} %",
        fontsize=9,
    )
    size.set_ylabel("MiB (pg_total_relation_size)")
    size.set_ylim(bottom=0)
    size.legend(fontsize=7, ncol=2, loc="center right")

    for name in TABLES:
        rows.plot(
            minutes,
            [s["tables"][name]["rows"] if name in s["tables"] else None for s in samples],
            label=name,
        )
    for name, style in (("jobs", "C0:"), ("outbox", "C1:")):
        rows.plot(
            minutes,
            [s["tables"][name]["dead_tup"] if name in s["tables"] else None for s in samples],
            style,
            label=f"{name} dead tuples",
        )
    runs = sorted(
        {at for table in report["autovacuum"].values() for at in table.get("runs_seen_at_s", [])}
    )
    if runs:
        rows.plot(
            [at / 60 for at in runs],
            [1.0] * len(runs),
            "v",
            color="grey",
            transform=rows.get_xaxis_transform(),
            clip_on=False,
            label="autovacuum ran (any of the six)",
        )
    rows.set_ylabel("rows (count(*)), dead tuples")
    rows.set_ylim(0, rows.get_ylim()[1] * 1.45)  # room for the legend
    rows.legend(fontsize=7, ncol=3, loc="upper left")

    for name in TABLES:
        dels = [float(s["tables"][name]["del"]) if name in s["tables"] else 0.0 for s in samples]
        pruned.plot(*_rate(minutes, dels), label=f"{name} deleted")
    accepted = [float(s["accepted_jobs"] + s["batch_jobs_accepted"]) for s in samples]
    pruned.plot(*_rate(minutes, accepted), "k--", label="jobs accepted")
    pruned.set_ylabel(f"rows / s over {RATE_SPAN_S:.0f} s (n_tup_del)")
    pruned.set_xlabel("minutes from the first submit")
    pruned.set_ylim(0, pruned.get_ylim()[1] * 1.35)
    pruned.legend(fontsize=7, ncol=3, loc="upper left")

    for axes in (size, rows, pruned):
        axes.axvline(window_min, color="grey", linestyle=":", linewidth=1)
    size.annotate("window reached", (window_min, 0), fontsize=8, va="bottom")
    save(fig, path)
