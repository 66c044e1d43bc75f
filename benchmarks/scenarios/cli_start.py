"""How long the ``sluicegate`` command takes to start: ``--help``, and ``submit`` and
``summarize`` up to their first answer (docs/benchmarks.md#cli_start).

    python -m benchmarks.scenarios.cli_start [--runs N] [--checkout DIR] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.lib.reports import OUT_DIR
from sluicegate.local.embedded import free_port

OUT = OUT_DIR / "cli_start.json"
TARGET_S = 0.5


def commands(folder: Path, api: str) -> dict[str, list[str]]:
    return {
        "--help": ["--help"],
        "submit --help": ["submit", "--help"],
        "summarize --help": ["summarize", "--help"],
        "submit FILE (no stack)": ["submit", str(folder / "a.txt"), "--api", api],
        "summarize DIR (no stack)": [
            "summarize",
            str(folder),
            "--api",
            api,
            "--out",
            str(folder.parent / "results.jsonl"),
        ],
    }


# Runs ``sluicegate`` from another checkout: this one is installed editable, and its finder
# would win over PYTHONPATH, so it is taken off first.
OTHER_CHECKOUT = (
    "import runpy, sys; "
    "sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in type(f).__module__]; "
    "sys.path.insert(0, sys.argv.pop(1)); sys.argv[0] = 'sluicegate'; "
    "runpy.run_module('sluicegate', run_name='__main__')"
)


def time_once(args: list[str], env: dict[str, str], checkout: Path | None) -> float:
    python = [sys.executable, "-m", "sluicegate"]
    if checkout is not None:
        python = [sys.executable, "-c", OTHER_CHECKOUT, str(checkout.resolve())]
    started = time.perf_counter()
    subprocess.run(
        [*python, *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=False,
    )
    return time.perf_counter() - started


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.scenarios.cli_start", description=__doc__
    )
    p.add_argument("--runs", type=int, default=15, help="runs of each command (default 15)")
    p.add_argument("--checkout", type=Path, default=None, help="time this checkout instead")
    p.add_argument("--quick", action="store_true", help="3 runs, nothing written")
    p.add_argument("--out", type=Path, default=None, help="default docs/bench/cli_start.json")
    return p


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parser().parse_args(argv)
    runs = 3 if args.quick else args.runs
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "docs"
        folder.mkdir()
        (folder / "a.txt").write_text("A short document.")
        env = {**os.environ, "SLUICEGATE_DATA_DIR": str(Path(tmp) / "data")}
        api = f"http://127.0.0.1:{free_port()}"
        figures = {}
        for name, command in commands(folder, api).items():
            time_once(command, env, args.checkout)  # a warm page cache, as a user's second run
            seconds = [time_once(command, env, args.checkout) for _ in range(runs)]
            figures[name] = {"median_s": statistics.median(seconds), "max_s": max(seconds)}
            print(
                f"{name:28} median {figures[name]['median_s']:.3f} s   "
                f"slowest {figures[name]['max_s']:.3f} s"
            )
    report = {
        "runs": runs,
        "code": str(args.checkout or "this checkout"),
        "target_s": TARGET_S,
        "commands": figures,
    }
    if args.out is not None or not args.quick:
        out = args.out or OUT
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main()
