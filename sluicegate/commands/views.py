"""What ``status``, ``jobs`` and ``batches`` print: rich renderables made from the API's
answers (pure: no I/O, so they are tested on their own)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from schemas.api import GraphView, JobView
from schemas.batches import BatchView
from schemas.jobs import JobKind
from schemas.overview import Overview, PoolAdmissionView
from schemas.states import JobState
from schemas.timeline import JobTimeline
from schemas.webhooks import DeliveryDetail

STATES = [s.value for s in JobState]
ADMISSION_STYLE = {"open": "green", "throttling": "yellow", "refusing": "red", "unknown": "red"}
NONE = "-"
FINISHED = {
    "stop": "stop (the output ended)",
    "length": "length (cut at max_tokens: raise it for a whole output)",
}


def overview(view: Overview, api_url: str, problem: str | None = None) -> RenderableType:
    """The pipeline at a glance; ``problem``: a line on why the view may be old."""
    scope = "every tenant" if view.operator else "this key's tenant"
    head = Text(f"Sluicegate at {api_url}: {scope}, ended jobs of the last {_span(view.window_s)}")
    parts: list[RenderableType] = [head, admission(view)]
    if len(view.pools) > 1:  # a line a model's pool
        parts[1:] = [Text("admission by model"), *(admission(view, p) for p in view.pools)]
    if problem:
        parts.append(Text(problem, style="bold red"))
    for section in (jobs_by_state(view), drops(view), deliveries(view), workers(view)):
        parts += [Text(""), section]  # a blank line ends each table
    return Group(*parts)


def admission(view: Overview, pool: PoolAdmissionView | None = None) -> Text:
    """Admission as a submit meets it: the first pool's, or ``pool``'s on a line of its own."""
    a = pool or view.admission
    line = Text(f"  {pool.model}: " if pool else "admission ")
    line.append(a.state, style=ADMISSION_STYLE.get(a.state, ""))
    lag = NONE if a.lag is None else str(a.lag)
    line.append(f"  lag {lag} (soft {a.lag_soft}, hard {a.lag_hard})")
    if a.reading_age_s is not None:
        line.append(f", read {a.reading_age_s:.1f} s ago")
    if a.retry_after_s is not None and a.state != "open":
        line.append(f"  retry after {a.retry_after_s:g} s")
    return line


def jobs_by_state(view: Overview) -> RenderableType:
    """A row a model, a column a state that has jobs; '-' for none."""
    if not view.jobs:
        return Text("jobs      none")
    counts = {(c.model, c.state): c.count for c in view.jobs}
    states = [s for s in STATES if any(state == s for _, state in counts)]
    models = sorted({model for model, _ in counts})
    table = Table("model", *states, title="jobs", title_justify="left", box=None)
    for model in models:
        table.add_row(model, *(str(counts.get((model, s), NONE)) for s in states))
    return table


def drops(view: Overview) -> RenderableType:
    if not view.drops:
        return Text("drops     none")
    table = Table("state", "reason", "count", title="drops", title_justify="left", box=None)
    for d in view.drops:
        table.add_row(d.state, d.reason, str(d.count))
    return table


def deliveries(view: Overview) -> Text:
    """The webhook deliveries waiting: those due and not claimed, how long the oldest has
    waited (red when the API finds the dispatchers behind), and all pending (in flight and
    awaiting a retry included)."""
    d = view.deliveries
    if not d.pending:
        return Text("webhooks  none pending")
    line = Text(f"webhooks  {d.due} due")
    if d.oldest_due_s is not None:
        line.append(", oldest due ")
        line.append(f"{d.oldest_due_s:.1f} s", style="red" if d.behind else "")
        line.append(" ago")
    line.append(f"; {d.pending} pending")
    return line


def workers(view: Overview) -> RenderableType:
    if not view.workers:
        return Text("workers   none report themselves")
    table = Table(
        "worker", "model", "engine", "running", "kv", "seen",
        title="workers", title_justify="left", box=None,
    )  # fmt: skip
    for w in view.workers:
        engine = f"{w.engine} (simulated)" if w.engine == "sim" else w.engine
        kv = NONE if w.kv_usage is None else f"{w.kv_usage:.0%}"
        seen = f"{w.last_seen_s:.0f} s ago"
        table.add_row(
            w.id,
            w.model,
            engine,
            f"{w.running}/{w.capacity}",
            kv,
            Text(f"stale, {seen}", style="red") if w.stale else seen,
        )
    return table


def job_list(jobs: list[JobView], more: bool) -> RenderableType:
    if not jobs:
        return Text("no jobs")
    table = Table("id", "state", "model", "tenant", "created", "ended", box=None)
    for job in jobs:
        reason = (job.error or {}).get("reason")
        ended = NONE if job.finished_at is None else _time(job.finished_at)
        table.add_row(
            job.id,
            job.state.value,
            job.model,
            job.tenant,
            _time(job.created_at),
            ended if reason is None else f"{ended} {reason}",
        )
    return _with_more(table, more, "jobs")


def batch_list(batches: list[BatchView], more: bool) -> RenderableType:
    if not batches:
        return Text("no batches")
    table = Table("id", "status", "done", "failed", "total", "created", box=None)
    for b in batches:
        c = b.request_counts
        table.add_row(
            b.id,
            b.status,
            str(c.completed),
            str(c.failed),
            str(c.total),
            _time(datetime.fromtimestamp(b.created_at, UTC)),
        )
    return _with_more(table, more, "batches")


def graph_text(g: GraphView) -> str:
    """``15 chunks in 3 levels: level 1 running, 2 of 3 ended``."""
    if g.ended >= g.total and g.level + 1 >= g.levels:
        return f"{g.chunks} chunks in {g.level + 1} levels, all ended"
    return (
        f"{g.chunks} chunks in {g.levels} levels: level {g.level} running, "
        f"{g.ended} of {g.total} ended"
    )


def timeline(t: JobTimeline) -> RenderableType:
    steps = Table(box=None, show_header=False)
    rows = [
        ("job", t.id),
        ("tenant", t.tenant),
        ("model", t.model),
        ("state", t.state.value + (f" ({t.end_reason})" if t.end_reason else "")),
        ("accepted", _time(t.accepted_at)),
        ("dispatched", _opt_time(t.dispatched_at)),
        ("started", _opt_time(t.started_at)),
        ("ended", _opt_time(t.ended_at)),
        ("deadline", _time(t.deadline)),
        ("attempts", str(t.attempts)),
        ("engine", t.engine or NONE),
        ("served by", t.served_model or NONE),
        ("tokens", f"{_opt(t.prompt_tokens)} in, {_opt(t.completion_tokens)} out"),
    ]
    if t.graph is not None:
        rows.append(("graph", graph_text(t.graph)))
    if t.parent_id is not None:
        rows.append(("part of", t.parent_id))
    if t.finish_reason is not None:
        rows.append(("finish", FINISHED.get(t.finish_reason, t.finish_reason)))
    if t.error:
        rows.append(("error", error_text(t.error)))
    if t.batch_id:
        rows.insert(3, ("batch", f"{t.batch_id} ({t.custom_id})"))
    for name, value in rows:
        steps.add_row(name, Text(value))  # as given: a message is never read as markup
    parts: list[RenderableType] = [steps]
    parts += [delivery(d) for d in t.deliveries] or [Text("webhooks   none")]
    if t.text is not None:
        parts += [Text(""), Text("summary:" if t.kind is JobKind.SUMMARIZE else "output:")]
        parts.append(Text(t.text))
    return Group(*parts)


def error_text(error: dict[str, Any]) -> str:
    """``engine_unavailable: the server answered 503``: an ended job's error, code first."""
    code = error.get("code") or error.get("reason") or "error"
    message = error.get("message")
    return f"{code}: {message}" if message else str(code)


def delivery(d: DeliveryDetail) -> RenderableType:
    head = Text(f"webhook {d.id} {d.event_type} to {d.url}: {d.state.value}")
    if d.dead_letter_reason:
        head.append(f" ({d.dead_letter_reason})")
    table = Table("attempt", "at", "status", "error", "ms", box=None)
    for a in d.attempt_log:
        table.add_row(
            str(a.attempt), _time(a.at), _opt(a.status_code), a.error or "", f"{a.duration_ms:.0f}"
        )
    return Group(head, table) if d.attempt_log else head


def _with_more(table: Table, more: bool, what: str) -> RenderableType:
    if not more:
        return table
    return Group(table, Text(f"more {what}: raise --limit, or narrow the filters"))


def _span(seconds: int) -> str:
    if seconds % 3600 == 0:
        return f"{seconds // 3600}h"
    return f"{seconds // 60}m" if seconds % 60 == 0 else f"{seconds}s"


def _time(at: datetime) -> str:
    return f"{at.astimezone():%Y-%m-%d %H:%M:%S}"


def _opt_time(at: datetime | None) -> str:
    return NONE if at is None else _time(at)


def _opt(value: int | None) -> str:
    return NONE if value is None else str(value)
