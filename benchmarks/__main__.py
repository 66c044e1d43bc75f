"""Every benchmark scenario, one after another, in under 15 minutes on a 2-core machine.

    python -m benchmarks [--only NAME]... [--quick] [--out-dir DIR]

Each scenario is a module of ``benchmarks.scenarios`` (docs/benchmarks.md says what each
measures) with one shape, which this runner calls:

- ``parser()``: its ``argparse.ArgumentParser``, which takes ``--quick`` (a smoke run of a
  few seconds) and ``--out PATH`` (its JSON; the PNG is written beside it);
- ``main(argv)``: runs it with those arguments, prints its figures, writes its JSON and PNG
  (to ``--out``, or by default docs/bench/NAME.json; a ``--quick`` run writes only when
  ``--out`` is given) and returns its report;
- ``headline(report)`` (optional): the figures for the summary table.

The suite runs each scenario with the shorter arguments in ``SCENARIOS`` (the modules'
own defaults are the longer runs of the README's figures), writes docs/bench/NAME.json and
NAME.png for each and docs/bench/summary.json, and ends with a table of the headline
figures. ``--quick`` runs every scenario with ``--quick`` and writes into a temporary
directory, never docs/bench. The scenarios marked `in_suite=False` (the soak, files,
retention, costs, relay_rate, fleet, brokers, scale, overview, isolation, toast, webhooks,
graphs) run only when named (``--only soak``).
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import os
import platform
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from benchmarks.lib.reports import OUT_DIR

BUDGET_S = 15 * 60  # the whole suite, on a quiet 2-core machine


@dataclass(frozen=True, kw_only=True)
class Scenario:
    name: str
    module: str
    argv: tuple[str, ...]  # the suite's arguments (not --quick)
    expected_s: float  # what a suite run takes on a quiet 2-core machine, about
    in_suite: bool = True  # run without --only


SCENARIOS: tuple[Scenario, ...] = (
    # The heptamini, then a 20 s burst at 10x the drain rate in reject and in block mode.
    Scenario(
        name="admission",
        module="benchmarks.scenarios.admission",
        argv=("--burst-s", "20"),
        expected_s=75,
    ),
    # Both workloads, KV-gated and greedy, on 300 jobs each (the README's: 800 and 400),
    # at real roofline time.
    Scenario(
        name="kv_pull",
        module="benchmarks.scenarios.kv_pull",
        argv=("--jobs", "300"),
        expected_s=230,
    ),
    # 3x capacity for 30 engine s at 2x roofline time, 60 s of wall time (the README's: 60
    # engine s at 4x, 240 s), the capacity measured over 30 engine s after 20 (the default:
    # 60 after 40).
    Scenario(
        name="overload",
        module="benchmarks.scenarios.overload",
        argv=(
            "--duration",
            "30",
            "--time-scale",
            "2",
            "--capacity-warm-s",
            "20",
            "--capacity-measure-s",
            "30",
        ),
        expected_s=315,
    ),
    # 50 one-at-a-time trials (the default: 200) and 200 waiters woken by one write.
    Scenario(
        name="longpoll",
        module="benchmarks.scenarios.longpoll",
        argv=("--single", "50", "--together", "200"),
        expected_s=35,
    ),
    # 1, 2 and 4 workers, a 20 s window each (the default: 30 s).
    Scenario(
        name="scale_out",
        module="benchmarks.scenarios.scale_out",
        argv=("--window-s", "20"),
        expected_s=140,
    ),
    # Celery on Redis as the baseline: its own defaults.
    Scenario(name="ingress", module="benchmarks.scenarios.ingress", argv=(), expected_s=90),
    # 10 minutes at 2x capacity as real processes: only with --only soak.
    Scenario(
        name="soak", module="benchmarks.scenarios.soak", argv=(), expected_s=900, in_suite=False
    ),
    # A 50,000-line batch file uploaded and made a batch: rates and the API's memory.
    Scenario(
        name="files", module="benchmarks.scenarios.files", argv=(), expected_s=120, in_suite=False
    ),
    # 15 minutes of load with windows of seconds: the database flat once past them.
    Scenario(
        name="retention",
        module="benchmarks.scenarios.retention",
        argv=(),
        expected_s=1000,
        in_suite=False,
    ),
    # What one accepted job costs each process, PostgreSQL and Kafka.
    Scenario(
        name="costs", module="benchmarks.scenarios.costs", argv=(), expected_s=360, in_suite=False
    ),
    # One relay publishing a full outbox: its saturated rows/s.
    Scenario(
        name="relay_rate",
        module="benchmarks.scenarios.relay_rate",
        argv=(),
        expected_s=60,
        in_suite=False,
    ),
    # 64 simulated workers in one group through a burst and a rebalance storm, KV-gated (its
    # --policy greedy: the greedy baseline of benchmarks/lib/greedy.py).
    Scenario(
        name="fleet", module="benchmarks.scenarios.fleet", argv=(), expected_s=1400, in_suite=False
    ),
    # Apache Kafka against Tansu: start, ingress, a short job's latency, the relay, broker CPU.
    Scenario(
        name="brokers",
        module="benchmarks.scenarios.brokers",
        argv=(),
        expected_s=420,
        in_suite=False,
    ),
    # The two above and what they say about 1,000 GPUs at 10,000 jobs/s.
    Scenario(
        name="scale",
        module="benchmarks.scenarios.scale",
        argv=("--from-reports",),
        expected_s=5,
        in_suite=False,
    ),
    # The jobs-by-state gauge's and the overview's reads beside 1,000,000 ended jobs.
    Scenario(
        name="overview",
        module="benchmarks.scenarios.overview",
        argv=(),
        expected_s=120,
        in_suite=False,
    ),
    # Two pools: model A flooded at 3x its capacity beside model B at half of its own.
    Scenario(
        name="isolation",
        module="benchmarks.scenarios.isolation",
        argv=(),
        expected_s=150,
        in_suite=False,
    ),
    # TOAST compression of inputs and results: pglz, and lz4 where the server has it.
    Scenario(
        name="toast",
        module="benchmarks.scenarios.toast",
        argv=(),
        expected_s=45,
        in_suite=False,
    ),
    # Three bursts of 40 job ends with callbacks on two simulated workers (a worker killed
    # in the last), then an idle dispatcher's claim on 1,000,000 ended deliveries.
    Scenario(
        name="webhooks",
        module="benchmarks.scenarios.webhooks",
        argv=(),
        expected_s=150,
        in_suite=False,
    ),
    # A 1,000-page document as one job on 1, 4 and 16 simulated workers, one sequence an
    # engine and a batch of 256: the map's speed-up, and a chunk's PostgreSQL statements
    # against the same chunks as plain jobs.
    Scenario(
        name="graphs",
        module="benchmarks.scenarios.graphs",
        argv=(),
        expected_s=2400,
        in_suite=False,
    ),
)
BY_NAME = {s.name: s for s in SCENARIOS}


class NotRunnable(Exception):
    """The scenario cannot run here; the message says why."""


def load(scenario: Scenario) -> ModuleType:
    """The scenario's module, imported now (a missing one is skipped, not fatal)."""
    try:
        return importlib.import_module(scenario.module)
    except ModuleNotFoundError as exc:
        if exc.name != scenario.module:
            raise
        raise NotRunnable(f"{scenario.module} does not exist (yet)") from None


def entry(module: ModuleType) -> Callable[[list[str]], dict[str, Any]]:
    """``module.main``, checked to take the argument list the runner passes."""
    main = getattr(module, "main", None)
    if not callable(main) or "argv" not in inspect.signature(main).parameters:
        raise NotRunnable(f"{module.__name__} has no main(argv) (the shape this runner calls)")
    return main  # type: ignore[no-any-return]


def headline(module: ModuleType, report: Any) -> dict[str, Any]:
    if not isinstance(report, dict):
        return {}
    pick = getattr(module, "headline", None)
    if callable(pick):
        figures: dict[str, Any] = pick(report)
        return figures
    return dict(report.get("headline") or report.get("ratios") or {})


def run_one(scenario: Scenario, *, quick: bool, out_dir: Path) -> dict[str, Any]:
    out = out_dir / f"{scenario.name}.json"
    argv = ["--quick"] if quick else list(scenario.argv)
    argv += ["--out", str(out)]
    print(f"\n=== {scenario.name}: python -m {scenario.module} {' '.join(argv)}", flush=True)
    started = time.monotonic()
    row: dict[str, Any] = {"argv": argv, "expected_s": scenario.expected_s}
    try:
        module = load(scenario)
        report = entry(module)(argv)
        row.update(status="ok", headline=headline(module, report))
    except NotRunnable as exc:
        row.update(status="skipped", reason=str(exc))
        print(f"skipped: {exc}", flush=True)
    except SystemExit as exc:  # a scenario that exits says why (e.g. a missing extra)
        row.update(status="skipped", reason=str(exc.code))
        print(f"skipped: {exc.code}", flush=True)
    except Exception as exc:
        row.update(status="failed", reason=f"{type(exc).__name__}: {exc}")
        traceback.print_exc()
    row["seconds"] = round(time.monotonic() - started, 1)
    print(f"=== {scenario.name}: {row['status']} in {row['seconds']} s", flush=True)
    return row


def table(rows: dict[str, dict[str, Any]]) -> str:
    lines = [("scenario", "status", "s (expected)", "figure", "value")]
    for name, row in rows.items():
        figures = list(row.get("headline", {}).items()) or [("", row.get("reason", ""))]
        for i, (figure, value) in enumerate(figures):
            first = i == 0
            lines.append(
                (
                    name if first else "",
                    row["status"] if first else "",
                    f"{row['seconds']:.0f} ({row['expected_s']:.0f})" if first else "",
                    figure,
                    "" if value is None else str(value),
                )
            )
    widths = [max(len(line[i]) for line in lines) for i in range(4)]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=False))
        + f"  {line[4]}"
        for line in lines
    )


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument(
        "--only", action="append", choices=list(BY_NAME), help="run this one (repeatable)"
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run of each scenario")
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=None,
        help="default docs/bench (a new temporary directory with --quick)",
    )
    return parser


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parser().parse_args(argv)
    chosen = [BY_NAME[n] for n in args.only] if args.only else [s for s in SCENARIOS if s.in_suite]
    if args.out_dir is not None:
        out_dir = args.out_dir
    elif args.quick:
        out_dir = Path(tempfile.mkdtemp(prefix="sluicegate-bench-quick-"))
    else:
        out_dir = OUT_DIR
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    rows = {s.name: run_one(s, quick=args.quick, out_dir=out_dir) for s in chosen}
    total = time.monotonic() - started
    summary = {
        "quick": args.quick,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}",
        "total_s": round(total, 1),
        "budget_s": BUDGET_S,
        "scenarios": rows,
    }
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    print(f"\n{table(rows)}\n")
    over = "" if total <= BUDGET_S else f" (over the {BUDGET_S // 60}-minute budget)"
    print(f"total {total:.0f} s{over}; wrote {out_dir}/summary.json and each scenario's JSON")
    return summary


if __name__ == "__main__":
    summary = main()
    sys.exit(0 if all(r["status"] != "failed" for r in summary["scenarios"].values()) else 1)
