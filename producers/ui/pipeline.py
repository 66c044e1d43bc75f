"""The pipeline's page: the live lag and admission state, each worker's capacity and the
drop reasons, in a panel the page polls every few seconds (htmx); and the webhook
deliveries, dead letters first, with their redelivery."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from producers.api.deps import Admission, Monitor, Webhooks
from producers.ui.pages import PageRoute, render
from producers.ui.session import Viewing
from schemas.jobs import Priority
from schemas.webhooks import DeliveryState

router = APIRouter(route_class=PageRoute)
POLL_S = 3
DELIVERIES = 50


def _overview(admission: Admission, monitor: Monitor) -> dict[str, Any]:
    lag = monitor.snapshot()
    soft, hard = admission.thresholds_now(Priority.NORMAL)
    return {
        "lag": lag.lag if lag.known else None,
        "lag_soft": soft,
        "lag_hard": hard,
        "drain_rate": lag.drain_rate,
        "arrival_rate": lag.arrival_rate,
        "stalled_s": lag.stalled_s,
        "cause": lag.cause,
        "admission": "unknown" if not lag.known else admission_state(lag.lag, soft, hard),
        "blocked": admission.blocked,
        "workers": [],
        "drops": {},
    }


def admission_state(lag: int, soft: int, hard: int) -> str:
    """What a normal-priority submit meets at this lag."""
    if lag >= hard:
        return "refusing"
    if lag >= soft:
        return "throttling"
    return "admitting"


@router.get("/pipeline", response_class=HTMLResponse, summary="The pipeline, live")
async def pipeline_page(
    request: Request, viewer: Viewing, admission: Admission, monitor: Monitor
) -> HTMLResponse:
    return render(
        request,
        "pipeline.html",
        viewer,
        overview=_overview(admission, monitor),
        poll_s=POLL_S,
    )


@router.get(
    "/pipeline/panel", response_class=HTMLResponse, summary="The pipeline panel the page polls"
)
async def pipeline_panel(
    request: Request, viewer: Viewing, admission: Admission, monitor: Monitor
) -> HTMLResponse:
    return render(
        request,
        "pipeline_panel.html",
        viewer,
        overview=_overview(admission, monitor),
        poll_s=POLL_S,
    )


@router.get("/webhooks", response_class=HTMLResponse, summary="The webhook deliveries")
async def deliveries_page(
    request: Request, viewer: Viewing, hooks: Webhooks, state: str | None = None
) -> HTMLResponse:
    chosen = DeliveryState(state) if state in set(DeliveryState) else None
    found, _ = await hooks.deliveries(
        viewer.tenant, state=chosen, subject=None, after=None, limit=DELIVERIES
    )
    return render(
        request,
        "webhooks.html",
        viewer,
        deliveries=found,
        chosen=chosen,
        states=[s.value for s in DeliveryState],
    )
