"""What `sluicegate status` prints from an overview, and the CLI's names of states."""

from __future__ import annotations

import io
from typing import get_args

from rich.console import Console, RenderableType

from schemas.batches import Status
from schemas.overview import (
    AdmissionView,
    DeliveriesView,
    DropCount,
    JobCount,
    Overview,
    PoolAdmissionView,
    WorkerView,
)
from schemas.states import JobState
from sluicegate.commands import ops_args, views


def text(renderable: RenderableType) -> str:
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(renderable)
    return console.export_text()


def overview(**admission: object) -> Overview:
    return Overview(
        generated_at=0.0,
        window_s=3600,
        operator=False,
        admission=AdmissionView(
            **{
                "state": "open",
                "lag": 3,
                "lag_soft": 100,
                "lag_hard": 200,
                "reading_age_s": 0.25,
                "retry_after_s": None,
                **admission,
            }
        ),
        jobs=[
            JobCount(model="default", state="succeeded", count=7),
            JobCount(model="sim", state="queued", count=2),
        ],
        drops=[DropCount(state="expired", reason="deadline_passed", count=1)],
        workers=[
            WorkerView(
                id="worker-1", model="sim", engine="sim", capacity=4, running=1,
                kv_usage=0.5, last_seen_s=1.2, stale=False,
            ),
            WorkerView(
                id="worker-2", model="m", engine="llamacpp", capacity=2, running=0,
                kv_usage=None, last_seen_s=40, stale=True,
            ),
        ],
    )  # fmt: skip


def test_the_cli_names_the_apis_states() -> None:
    assert list(ops_args.JOB_STATES) == [s.value for s in JobState]
    assert get_args(Status) == ops_args.BATCH_STATUSES


def test_status_shows_admission_jobs_drops_and_workers() -> None:
    shown = text(views.overview(overview(), "http://api"))
    assert "this key's tenant, ended jobs of the last 1h" in shown
    assert "admission open  lag 3 (soft 100, hard 200), read 0.2 s ago" in shown
    assert "retry after" not in shown
    rows = {line.split()[0]: line.split()[1:] for line in shown.splitlines() if line.strip()}
    assert rows["model"] == ["queued", "succeeded"]  # the states with jobs, in order
    assert rows["default"] == ["-", "7"]
    assert rows["sim"] == ["2", "-"]
    assert rows["expired"] == ["deadline_passed", "1"]
    assert rows["worker-1"] == ["sim", "sim", "(simulated)", "1/4", "50%", "1", "s", "ago"]
    assert rows["worker-2"] == ["m", "llamacpp", "0/2", "-", "stale,", "40", "s", "ago"]


def test_a_refusing_api_says_when_to_retry_and_a_lost_one_says_so() -> None:
    refusing = overview(state="refusing", lag=250, retry_after_s=4.0)
    shown = text(views.overview(refusing, "http://api", "cannot reach the API"))
    assert "admission refusing  lag 250 (soft 100, hard 200), read 0.2 s ago  retry after 4 s" in (
        shown
    )
    assert "cannot reach the API" in shown
    unknown = text(views.admission(overview(state="unknown", lag=None).model_copy()))
    assert "admission unknown  lag - (soft 100" in unknown


def test_with_several_pools_status_shows_each_models_admission() -> None:
    one = overview()
    pools = [
        PoolAdmissionView(model="alpha", **{**one.admission.model_dump(), "state": "refusing"}),
        PoolAdmissionView(model="beta", **{**one.admission.model_dump(), "lag": 0}),
    ]
    shown = text(views.overview(one.model_copy(update={"pools": pools}), "http://api"))
    assert "admission by model" in shown
    assert "  alpha: refusing  lag 3 (soft 100, hard 200)" in shown
    assert "  beta: open  lag 0 (soft 100, hard 200)" in shown
    # One pool: the one line, as before.
    single = text(views.overview(one.model_copy(update={"pools": pools[:1]}), "http://api"))
    assert "admission by model" not in single
    assert "admission open  lag 3" in single


def waiting(**deliveries: object) -> Overview:
    counts = {"pending": 0, "due": 0, "oldest_due_s": None, "behind": False, **deliveries}
    return overview().model_copy(update={"deliveries": DeliveriesView(**counts)})


def test_status_shows_the_webhook_deliveries_waiting() -> None:
    none = text(views.overview(overview(), "http://api"))
    assert "webhooks  none pending" in none
    # After the drops, before the workers.
    assert none.index("drops") < none.index("webhooks") < none.index("workers")

    shown = text(views.overview(waiting(pending=10, due=3, oldest_due_s=12.34), "http://api"))
    assert "webhooks  3 due, oldest due 12.3 s ago; 10 pending" in shown
    # In flight or awaiting a retry, none due: no oldest.
    assert views.deliveries(waiting(pending=2)).plain == "webhooks  0 due; 2 pending"


def test_the_oldest_due_is_red_when_the_dispatchers_are_behind() -> None:
    def red(view: Overview) -> list[str]:
        line = views.deliveries(view)
        return [line.plain[s.start : s.end] for s in line.spans if str(s.style) == "red"]

    assert red(waiting(pending=1, due=1, oldest_due_s=75.0, behind=True)) == ["75.0 s"]
    assert red(waiting(pending=1, due=1, oldest_due_s=5.0)) == []
