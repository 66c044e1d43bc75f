"""Where the scenarios write, and how they show their figures: the JSON report (its plot
beside it), a percentile, aligned text columns."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

# Where every scenario writes its JSON and PNG.
OUT_DIR = Path(__file__).resolve().parents[2] / "docs" / "bench"


def write_report(
    report: dict[str, Any], out: Path, plot: Callable[[Path], None] | None = None
) -> None:
    """A scenario's figures as JSON at ``out``, and its plot beside it (``out`` as .png)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    if plot is not None:
        plot(out.with_suffix(".png"))
    print(f"wrote {out}")


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def columns(rows: Sequence[Sequence[str]]) -> str:
    """Rows as aligned text columns: the first to the left, the others to the right."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in rows
    )
