"""The soak's plot: each process's RSS over time, and the submits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.lib.plots import pyplot, save


def plot_soak(samples: list[dict[str, Any]], *, path: Path) -> None:
    """The soak: each process's RSS over time, and the submit latency and answers."""
    plt = pyplot()
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
    save(fig, path)
