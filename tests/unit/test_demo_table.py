"""The demo's table: a short row a document, the full summaries in a file it names."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from rich.console import Console

from client.demo import Tracked, results_table, short, write_results
from schemas.api import JobView

AT = datetime(2026, 1, 1, tzinfo=UTC)
LONG = " ".join(f"Sentence {i} of a summary that goes on and on." for i in range(30))


def view(job_id: str, text: str, *, simulated: bool = False) -> JobView:
    return JobView(
        id=job_id,
        tenant="default",
        kind="summarize",
        state="succeeded",
        priority="normal",
        max_tokens=120,
        deadline=AT + timedelta(hours=1),
        callback_url=None,
        created_at=AT,
        updated_at=AT,
        dispatched_at=AT,
        started_at=AT,
        finished_at=AT + timedelta(seconds=3),
        attempt=1,
        result={"text": text, "engine": "sim", "simulated": simulated, "served_model": "sim"},
        error=None,
        abandon_on_disconnect=False,
        abandon_after_s=None,
        last_seen_at=AT,
        decoded_tokens=120,
        status_url=f"/v1/jobs/{job_id}",
    )


def jobs(count: int, *, simulated: bool = False) -> list[Tracked]:
    return [
        Tracked(f"doc-{i}.md", f"j{i}", 0.0, view(f"j{i}", LONG, simulated=simulated), 1.0)
        for i in range(count)
    ]


def test_a_summary_is_cut_to_a_line_or_two() -> None:
    assert short("a  b\n\nc") == "a b c"
    cut = short(LONG)
    assert len(cut) <= 120
    assert cut.endswith("…")
    assert LONG.startswith(cut[:-1])


@pytest.mark.parametrize("width", [80, 120, 200])
def test_six_documents_make_a_row_of_one_line_each(width: int) -> None:
    console = Console(width=width, record=True, color_system=None)
    console.print(results_table(jobs(6, simulated=True), width))
    assert "doc-0.md" in console.export_text(clear=False)
    lines = console.export_text().splitlines()
    assert len(lines) <= 6 + 6, "\n".join(lines)  # title, rules, header, and a line a row
    assert "simulated" in lines[0]
    assert all(len(line) <= width for line in lines)


def test_the_full_summaries_are_in_the_results_file(tmp_path: Path) -> None:
    path = tmp_path / "demo" / "results.jsonl"
    write_results(jobs(2), path)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["document"] for r in rows] == ["doc-0.md", "doc-1.md"]
    assert rows[0]["summary"] == LONG
    assert (rows[0]["state"], rows[0]["served_model"]) == ("succeeded", "sim")
