"""The fleet benchmark's figures: goodput each second from the jobs' rows, by phase, the
recovery after the storm, the rebalances each move caused, and a run's summary."""

from __future__ import annotations

import argparse
import dataclasses
import statistics
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from benchmarks.lib.fleet.plan import Plan
from benchmarks.lib.fleet.sampler import Sample
from benchmarks.lib.reports import percentile
from benchmarks.lib.stack import TERMINAL
from schemas.envelopes import JobEvent


def per_second(rows: list[dict[str, Any]], wall0: datetime, horizon: int) -> list[list[float]]:
    """[s, jobs succeeded, output tokens] for each second from the first arrival."""
    jobs_s = [0] * (horizon + 1)
    tokens_s = [0] * (horizon + 1)
    for r in rows:
        if r["state"] != "succeeded" or r["finished_at"] is None:
            continue
        at = int((r["finished_at"] - wall0).total_seconds())
        if 0 <= at <= horizon:
            jobs_s[at] += 1
            tokens_s[at] += (r["result"] or {}).get("output_tokens", 0)
    return [[s, jobs_s[s], tokens_s[s]] for s in range(horizon + 1)]


def rolling(values: list[float], width: int) -> list[float]:
    return [sum(values[max(0, i - width + 1) : i + 1]) / width for i in range(len(values))]


def recovery(goodput: list[list[float]], sched: Plan, width: int = 5) -> float | None:
    """Seconds from the storm's end until the goodput (a ``width``-s mean) is back to 90 %
    of the warm-up's second half; None if it never is."""
    warm_start, warm_end = sched.phases["warm"]
    half = [g[1] for g in goodput if (warm_start + warm_end) / 2 <= g[0] < warm_end]
    target = 0.9 * (sum(half) / len(half)) if half else 0.0
    smooth = rolling([g[1] for g in goodput], width)
    storm_end = sched.phases["storm"][1]
    for g, mean in zip(goodput, smooth, strict=True):
        if g[0] >= storm_end and mean >= target:
            return round(g[0] - storm_end, 1)
    return None


def phase_figures(
    samples: list[Sample], goodput: list[list[float]], sched: Plan, time_scale: float
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, (start, end) in sched.phases.items():
        inside = [s for s in samples if start <= s.at_s < end]
        seconds = [g for g in goodput if start <= g[0] < end]
        span = max(end - start, 1e-9)
        figures: dict[str, Any] = {
            "goodput_jobs_per_s": round(sum(g[1] for g in seconds) / span, 2),
            "goodput_output_tokens_per_s": round(sum(g[2] for g in seconds) / span, 1),
        }
        if len(inside) >= 2:
            first, last = inside[0], inside[-1]
            busy = last.busy_s - first.busy_s
            wall = last.at_s - first.at_s
            figures.update(
                engine_speed=round((last.engine_s - first.engine_s) * time_scale / busy, 3)
                if busy > 0
                else None,
                process_cpu_share=round((last.cpu_s - first.cpu_s) / wall, 3),
                lag_max=max(s.lag for s in inside),
                event_loop_late_p99_ms=percentile([s.late_ms for s in inside], 0.99),
            )
        out[name] = figures
    return out


@dataclass(frozen=True, kw_only=True)
class Served:
    """The group at one instant (looked at every 0.1 s)."""

    at_s: float
    partitions: frozenset[int]  # held by a live member
    holders: frozenset[int]  # live members holding some
    settled: bool  # every partition held by one live member, every live member holding some


def settle_s(
    move: dict[str, Any], moves: list[dict[str, Any]], track: list[Served]
) -> float | None:
    """Seconds from ``move`` until what it disturbed is served again: every partition that
    was served just before it is held by a live member again (but for those of members
    that left after it, which count against their own move), and a joined member holds
    some. None if that never happens in ``track``."""
    at = move["at_s"]
    before = [s for s in track if s.at_s <= at]
    if not before:
        return None
    need = set(before[-1].partitions)
    later = sorted(
        (m["at_s"], set(m.get("partitions", ())))
        for m in moves
        if m["kind"] in ("kill", "drain") and m["at_s"] > at and "skipped" not in m
    )
    for state in (s for s in track if s.at_s > at):
        gone = set().union(*(p for left_at, p in later if left_at <= state.at_s))
        if not (need - gone) <= state.partitions:
            continue
        if move["kind"] == "join" and move["worker"] not in state.holders:
            continue
        return round(float(state.at_s - at), 1)
    return None


def rebalances(
    track: list[Served], moves: list[dict[str, Any]], end_s: float, partitions: int
) -> dict[str, Any]:
    """Each move's settle time (``settle_s``) by kind, and the seconds the group did not
    serve every partition with every live member holding some."""
    settle: dict[str, list[float]] = {"join": [], "drain": [], "kill": []}
    unsettled_moves = left_unsettled = 0
    leavers = {m["worker"] for m in moves if m["kind"] != "join" and "skipped" not in m}
    for move in moves:
        if "skipped" in move:
            continue
        took = settle_s(move, moves, track)
        if took is not None:
            settle[move["kind"]].append(took)
        elif move["kind"] == "join" and move["worker"] in leavers:
            left_unsettled += 1  # picked to leave before it was given partitions
        else:
            unsettled_moves += 1
    every = [v for values in settle.values() for v in values]
    inside = [s for s in track if s.at_s <= end_s]
    return {
        "settle_s_median": round(statistics.median(every), 1) if every else None,
        "settle_after_move_s": {
            k: {
                "median": round(statistics.median(v), 1) if v else None,
                "max": max(v, default=None),
                "count": len(v),
            }
            for k, v in settle.items()
        },
        "moves_never_settled_after": unsettled_moves,
        "joins_left_before_settling": left_unsettled,
        "seconds_unsettled": round(0.1 * sum(1 for s in inside if not s.settled), 1),
        "partitions_unserved_max": max((partitions - len(s.partitions) for s in inside), default=0),
    }


def summarize(
    result: dict[str, Any],
    rows: list[dict[str, Any]],
    events: list[JobEvent],
    samples: list[Sample],
    track: list[Served],
    sched: Plan,
    wall0: datetime,
    args: argparse.Namespace,
) -> dict[str, Any]:
    horizon = int(max((s.at_s for s in samples), default=0.0)) + 1
    goodput = per_second(rows, wall0, horizon)
    states = Counter(r["state"] for r in rows)
    expired = [r for r in rows if r["state"] == "expired"]
    stages = Counter((r["error"] or {}).get("stage", "unknown") for r in expired)
    attempts = {r["id"]: r["attempt"] for r in rows}
    ends = Counter(e.job_id for e in events if e.job_id in attempts)
    stale = [e for e in events if e.job_id in attempts and e.attempt != attempts[e.job_id]]
    phases = phase_figures(samples, goodput, sched, args.time_scale)
    lags = [s.lag for s in samples if s.at_s < sched.phases["tail"][1]]
    run_span = sched.phases["tail"][1]
    succeeded = [g for g in goodput if g[0] < run_span]
    speeds = [f["engine_speed"] for f in phases.values() if f.get("engine_speed") is not None]
    summary = {
        "arrivals": len(sched.arrivals),
        "accepted": len(rows),
        "never_accepted": len(sched.arrivals) - len(rows),
        "refused_attempts": sum(result["refusals_by_reason"].values()),
        "succeeded": states["succeeded"],
        "goodput_jobs_per_s": round(sum(g[1] for g in succeeded) / run_span, 2),
        "goodput_output_tokens_per_s": round(sum(g[2] for g in succeeded) / run_span, 1),
        "goodput_burst_jobs_per_s": phases["burst"]["goodput_jobs_per_s"],
        "goodput_storm_jobs_per_s": phases["storm"]["goodput_jobs_per_s"],
        "goodput_warm_jobs_per_s": phases["warm"]["goodput_jobs_per_s"],
        "lag_max": max(lags, default=0),
        "lag_p95": percentile([float(x) for x in lags], 0.95) if lags else None,
        "deadline_misses": len(expired),
        "deadline_misses_by_stage": dict(stages),
        "states": dict(states),
        "non_terminal": sum(v for k, v in states.items() if k not in TERMINAL),
        "takeovers": sum(1 for a in attempts.values() if a > 1),
        "duplicates": sum(1 for n in ends.values() if n > 1) + len(stale),
        "jobs_without_terminal_event": sum(
            1 for r in rows if r["state"] in TERMINAL and ends[r["id"]] == 0
        ),
        "recovery_s_after_storm": recovery(goodput, sched),
        "engine_speed_min": min(speeds, default=None),
        "process_cpu_share_max": max(
            (f["process_cpu_share"] for f in phases.values() if "process_cpu_share" in f),
            default=None,
        ),
        "kills": sum(1 for m in result["moves"] if m["kind"] == "kill" and "skipped" not in m),
        "drains": sum(1 for m in result["moves"] if m["kind"] == "drain" and "skipped" not in m),
        "joins": sum(1 for m in result["moves"] if m["kind"] == "join"),
        "leader_kills": sum(1 for m in result["moves"] if m.get("leader")),
    }
    moved = rebalances(track, result["moves"], sched.phases["tail"][1], args.partitions)
    warm = summary["goodput_warm_jobs_per_s"]
    summary.update(
        storm_over_warm=round(summary["goodput_storm_jobs_per_s"] / warm, 3) if warm else None,
        settle_s_median=moved["settle_s_median"],
    )
    return {
        **result,
        "summary": summary,
        "phases": phases,
        "rebalances": moved,
        "goodput_per_s": goodput,
        "samples": [dataclasses.asdict(s) for s in samples],
    }
