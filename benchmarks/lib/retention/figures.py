"""The retention benchmark's figures: the growth from the window to the end of the load
(sizes, least-squares slopes, the second half against the settling), the steady row
counts, prune and insert rates, and autovacuum runs per table."""

from __future__ import annotations

import itertools
from typing import Any

from benchmarks.lib.retention.database import COUNTED, TABLES

MIB = 1024 * 1024
# Flat: the database grows by under this share over the second half of the steady part. The
# first minutes past the window still grow while the dead rows between two autovacuum runs
# settle (reported apart, as the settling growth), so it is not the test of flatness.
FLAT_PCT = 5.0


def slope_per_min(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, value), per minute."""
    if len(points) < 2:
        return float("nan")
    mx = sum(x for x, _ in points) / len(points)
    my = sum(y for _, y in points) / len(points)
    sxx = sum((x - mx) ** 2 for x, _ in points)
    sxy = sum((x - mx) * (y - my) for x, y in points)
    return sxy / sxx * 60 if sxx else float("nan")


def table_bytes(sample: dict[str, Any]) -> int:
    return sum(int(t["total"]) for t in sample["tables"].values())


def growth(
    samples: list[dict[str, Any]], window_s: float, load_s: float
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Sizes at the window and at the end of the load, and the steady samples between."""
    during = [s for s in samples if s["at_s"] <= load_s + 1.0]
    steady = [s for s in during if s["at_s"] >= window_s]
    if len(steady) < 2:
        return {"note": "the load ended before the window was reached"}, steady
    first, end = steady[0], steady[-1]
    minutes = (end["at_s"] - first["at_s"]) / 60

    def figures(value: Any) -> dict[str, float]:
        a, b = value(first) / MIB, value(end) / MIB
        return {
            "at_window_mib": round(a, 3),
            "at_end_mib": round(b, 3),
            "growth_mib": round(b - a, 3),
            "growth_pct": round(100 * (b - a) / a, 2) if a else float("nan"),
            "growth_mib_per_min": round((b - a) / minutes, 4),
            "slope_mib_per_min": round(
                slope_per_min([(s["at_s"], value(s) / MIB) for s in steady]), 4
            ),
        }

    def table(name: str) -> dict[str, Any]:
        out: dict[str, Any] = figures(lambda s: s["tables"][name]["total"])
        out["growth_mib_by_part"] = {
            part: round((end["tables"][name][key] - first["tables"][name][key]) / MIB, 3)
            for part, key in (("heap", "heap"), ("indexes", "indexes"), ("toast", "toast"))
        }
        return out

    middle = min(steady, key=lambda s: abs(s["at_s"] - (first["at_s"] + end["at_s"]) / 2))
    second_half_min = (end["at_s"] - middle["at_s"]) / 60
    out: dict[str, Any] = {
        "window_sample_at_s": first["at_s"],
        "end_sample_at_s": end["at_s"],
        "steady_minutes": round(minutes, 2),
        "database": figures(lambda s: s["database_bytes"]),
        "tables_sum": figures(table_bytes),
        "by_table": {name: table(name) for name in TABLES if name in first["tables"]},
        "index_growth_kib": dict(
            sorted(
                (
                    (name, round((end["index_bytes"][name] - size) / 1024, 1))
                    for name, size in first["index_bytes"].items()
                    if name in end["index_bytes"]
                ),
                key=lambda kv: -kv[1],
            )
        ),
        # The same from the middle of the steady part: is what growth there is settling?
        "second_half": {
            "from_s": middle["at_s"],
            "database_growth_mib": round(
                (end["database_bytes"] - middle["database_bytes"]) / MIB, 3
            ),
            "database_growth_mib_per_min": round(
                (end["database_bytes"] - middle["database_bytes"]) / MIB / second_half_min, 4
            )
            if second_half_min
            else None,
            "tables_growth_mib": round((table_bytes(end) - table_bytes(middle)) / MIB, 3),
        },
    }
    half = out["second_half"]
    half["database_growth_pct"] = round(
        100 * (end["database_bytes"] - middle["database_bytes"]) / middle["database_bytes"], 2
    )
    half["settling_growth_mib"] = round(
        (middle["database_bytes"] - first["database_bytes"]) / MIB, 3
    )
    out["flat"] = abs(half["database_growth_pct"]) < FLAT_PCT
    out["flat_rule"] = f"|database growth over the second half of the steady part| < {FLAT_PCT} %"
    return out, steady


def steady_rows(steady: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    out = {}
    for name in TABLES:
        rows = [s["tables"][name]["rows"] for s in steady if name in s["tables"]]
        dead = [s["tables"][name]["dead_tup"] for s in steady if name in s["tables"]]
        if rows:
            out[name] = {
                "mean": round(sum(rows) / len(rows), 1),
                "min": min(rows),
                "max": max(rows),
                "dead_tup_mean": round(sum(dead) / len(dead), 1),
                "dead_tup_max": max(dead),
            }
    return out


def rates(steady: list[dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """Rows/s over the steady samples: pruned (counter), deleted and inserted (statistics)."""
    if len(steady) < 2:
        return {}
    first, end = steady[0], steady[-1]
    span = end["at_s"] - first["at_s"]
    out: dict[str, dict[str, float | None]] = {}
    for name in TABLES:
        a, b = first["tables"].get(name), end["tables"].get(name)
        if a is None or b is None:
            continue
        counted: float | None = None
        if name in COUNTED and first["pruned_total"] and end["pruned_total"]:
            counted = round((end["pruned_total"][name] - first["pruned_total"][name]) / span, 2)
        deleted = (b["del"] - a["del"]) / span
        inserted = (b["ins"] - a["ins"]) / span
        out[name] = {
            "pruned_per_s_counter": counted,
            "deleted_per_s_stats": round(deleted, 2),
            "inserted_per_s_stats": round(inserted, 2),
            "deleted_over_inserted": round(deleted / inserted, 3) if inserted else None,
        }
    return out


def autovacuum(samples: list[dict[str, Any]], window_s: float) -> dict[str, dict[str, Any]]:
    """Per table: autovacuum runs (counted from the statistics between samples) and when."""
    out: dict[str, dict[str, Any]] = {}
    for name in TABLES:
        series = [(s["at_s"], s["tables"][name]) for s in samples if name in s["tables"]]
        if not series:
            continue
        runs, toast_runs = [], []
        for (_, before), (at, after) in itertools.pairwise(series):
            if after["autovacuums"] > before["autovacuums"]:
                runs.append(at)
            if after["toast_autovacuums"] > before["toast_autovacuums"]:
                toast_runs.append(at)
        end = series[-1][1]
        out[name] = {
            "autovacuum_count": end["autovacuums"],
            "autoanalyze_count": end["autoanalyzes"],
            "toast_autovacuum_count": end["toast_autovacuums"],
            "runs_seen_at_s": runs,
            "runs_past_window": sum(1 for at in runs if at >= window_s),
            "toast_runs_seen_at_s": toast_runs,
            "last_autovacuum": end["last_autovacuum"],
            "dead_tup_at_end": end["dead_tup"],
            "dead_tup_max": max(t["dead_tup"] for _, t in series),
            "toast_dead_tup_max": max(t["toast_dead_tup"] for _, t in series),
        }
    return out
