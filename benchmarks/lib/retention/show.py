"""How the retention benchmark shows its figures: the size over time as a table, the growth
after the window, the steady rows and rates, autovacuum, and how full the pages were."""

from __future__ import annotations

import json
from typing import Any

from benchmarks.lib.reports import columns
from benchmarks.lib.retention.database import TABLES
from benchmarks.lib.retention.figures import MIB, table_bytes

SHORT = {
    "jobs": "jobs",
    "outbox": "outbox",
    "batches": "batches",
    "webhook_deliveries": "deliveries",
    "webhook_attempts": "attempts",
    "dead_letters": "dead_ltr",
}


def size_table(samples: list[dict[str, Any]], every_s: float, window_s: float) -> str:
    """The size over time, one row about every ``every_s``."""
    head = [
        "t s",
        "db MiB",
        "tables MiB",
        *(SHORT[n] for n in TABLES),
        "jobs rows",
        "outbox rows",
        "dead tup",
        "autovacuumed since",
    ]
    lines = [head]
    next_at = -1.0
    before: dict[str, Any] = samples[0]["tables"] if samples else {}
    for i, s in enumerate(samples):
        if s["at_s"] < next_at and i != len(samples) - 1:
            continue
        next_at = s["at_s"] + every_s
        t = s["tables"]
        vacuumed = [
            n
            for n in TABLES
            if n in t and n in before and t[n]["autovacuums"] > before[n]["autovacuums"]
        ]
        before = t
        mark = "*" if s["at_s"] >= window_s else ""
        lines.append(
            [
                f"{s['at_s']:.0f}{mark}",
                f"{s['database_bytes'] / MIB:.2f}",
                f"{table_bytes(s) / MIB:.2f}",
                *(f"{t[n]['total'] / MIB:.2f}" if n in t else "-" for n in TABLES),
                str(t.get("jobs", {}).get("rows", "-")),
                str(t.get("outbox", {}).get("rows", "-")),
                str(sum(v["dead_tup"] for v in t.values())),
                ",".join(SHORT[n] for n in vacuumed) or "-",
            ]
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    text = "\n".join(
        "  ".join(c.rjust(w) for c, w in zip(line, widths, strict=True)) for line in lines
    )
    return text + "\n(* past the window; sizes are pg_total_relation_size: heap, indexes, TOAST)"


def show(report: dict[str, Any]) -> None:
    """The figures, readable; the JSON has them all."""
    cfg, load, grew = report["config"], report["load"], report["growth_after_window"]
    shown = [
        "server_version",
        "autovacuum_naptime",
        "autovacuum_vacuum_scale_factor",
        "autovacuum_vacuum_threshold",
        "autovacuum_vacuum_cost_delay",
    ]
    pg = cfg["postgres"]
    print(f"\nPostgreSQL: {', '.join(f'{k}={pg[k]}' for k in shown if k in pg)}")
    print(
        f"load: {load['accepted_jobs_per_s']} jobs/s accepted over {load['load_s']} s "
        f"({load['single_accepted_per_s']} single, {load['batch_jobs_accepted_per_s']} in "
        f"{load['batches_accepted']} batches; capacity {cfg['capacity_jobs_per_s']} jobs/s); "
        f"single answers {load['single_answers']} (refused: "
        f"{load['single_refused_by_reason']}), batches refused {load['batches_refused']}; "
        f"jobs not ended at most {load['unfinished_jobs_max']}"
    )
    print(f"\nsize over time (window reached at {cfg['window_reached_s']:.0f} s):")
    print(size_table(report["samples"], max(30.0, cfg["sample_s"]), cfg["window_reached_s"]))
    if "database" not in grew:
        print(grew.get("note"))
    else:
        show_growth(grew)
    show_steady(report)
    show_storage(report)
    print("\n" + json.dumps(report["end"], indent=1))


def show_growth(grew: dict[str, Any]) -> None:
    """The growth from the window to the end of the load, by table, and the second half."""
    print(
        f"\ngrowth from the window ({grew['window_sample_at_s']} s) to the end of the load "
        f"({grew['end_sample_at_s']} s, {grew['steady_minutes']} min):"
    )
    rows = [("", "at window", "at end", "MiB", "%", "MiB/min", "slope MiB/min")]
    named = [("database", grew["database"]), ("tables (sum)", grew["tables_sum"])]
    for name, fig in [*named, *grew["by_table"].items()]:
        rows.append(
            (
                name,
                f"{fig['at_window_mib']:.3f}",
                f"{fig['at_end_mib']:.3f}",
                f"{fig['growth_mib']:+.3f}",
                f"{fig['growth_pct']:+.2f}",
                f"{fig['growth_mib_per_min']:+.4f}",
                f"{fig['slope_mib_per_min']:+.4f}",
            )
        )
    print(columns(rows))
    top = list(grew["index_growth_kib"].items())[:8]
    print("indexes that grew most (KiB): " + ", ".join(f"{n} {v:+.0f}" for n, v in top))
    half = grew["second_half"]
    print(
        f"settling (window to {half['from_s']} s): database "
        f"{half['settling_growth_mib']:+.3f} MiB; second half: database"
        f" {half['database_growth_mib']:+.3f} MiB ({half['database_growth_pct']:+.2f} %,"
        f" {half['database_growth_mib_per_min']} MiB/min), tables "
        f"{half['tables_growth_mib']:+.3f} MiB; flat ({grew['flat_rule']}): {grew['flat']}"
    )


def show_steady(report: dict[str, Any]) -> None:
    """The steady rows, the prune and insert rates, and the autovacuum runs, by table."""
    rows: list[tuple[str, ...]]
    rows = [("steady", "rows mean", "min", "max", "dead tup mean", "dead max")]
    for name, r in report["steady_rows"].items():
        rows.append(
            (
                name,
                f"{r['mean']:.0f}",
                str(r["min"]),
                str(r["max"]),
                f"{r['dead_tup_mean']:.0f}",
                str(r["dead_tup_max"]),
            )
        )
    print("\n" + columns(rows))
    rows = [("rows/s, steady", "pruned (counter)", "deleted (stats)", "inserted", "del/ins")]
    for name, r in report["rates_steady"].items():
        rows.append(
            (
                name,
                "-" if r["pruned_per_s_counter"] is None else f"{r['pruned_per_s_counter']}",
                f"{r['deleted_per_s_stats']}",
                f"{r['inserted_per_s_stats']}",
                "-" if r["deleted_over_inserted"] is None else f"{r['deleted_over_inserted']}",
            )
        )
    print("\n" + columns(rows))
    rows = [("autovacuum", "runs", "past window", "seen at s", "toast runs", "autoanalyze")]
    for name, r in report["autovacuum"].items():
        rows.append(
            (
                name,
                str(r["autovacuum_count"]),
                str(r["runs_past_window"]),
                ",".join(f"{at:.0f}" for at in r["runs_seen_at_s"]) or "-",
                str(r["toast_autovacuum_count"]),
                str(r["autoanalyze_count"]),
            )
        )
    print("\n" + columns(rows))


def show_storage(report: dict[str, Any]) -> None:
    """How full the tables' and indexes' pages were as the load ended (pgstattuple)."""
    rows: list[tuple[str, ...]]
    pages = report["storage_at_load_end"]
    if "tables" in pages:
        rows = [("pgstattuple, load end", "KiB", "live %", "dead %", "free %")]
        for name, t in pages["tables"].items():
            rows.append(
                (
                    name,
                    f"{t['table_len'] / 1024:.0f}",
                    f"{t['tuple_percent']:.1f}",
                    f"{t['dead_tuple_percent']:.1f}",
                    f"{t['free_percent']:.1f}",
                )
            )
        print("\n" + columns(rows))
        rows = [
            ("pgstatindex, load end", "KiB", "leaf pages", "empty", "deleted", "leaf density %")
        ]
        for name, i in pages["indexes"].items():
            rows.append(
                (
                    name,
                    f"{i['bytes'] / 1024:.0f}",
                    f"{i['leaf_pages']:.0f}",
                    f"{i['empty_pages']:.0f}",
                    f"{i['deleted_pages']:.0f}",
                    f"{i['avg_leaf_density']:.1f}",
                )
            )
        print("\n" + columns(rows))
    else:
        print(pages.get("note"))
