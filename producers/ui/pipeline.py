"""The pipeline's page: the live lag and admission state, each worker's capacity and the
drop reasons, in a panel the page polls every few seconds (htmx); and the webhook
deliveries, dead letters first, with their redelivery."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from producers.api import overview as overview_api
from producers.api import webhooks as webhooks_api
from producers.api.deps import AppSettings, Monitor, Overviews, Pools, Webhooks
from producers.ui.pages import PageRoute, render
from producers.ui.session import Viewing, Writing
from schemas.errors import SluicegateError
from schemas.states import JobState
from schemas.webhooks import DeliveryState

router = APIRouter(route_class=PageRoute)
POLL_S = 3
# Ended jobs and drops of the last this many seconds.
WINDOW_S = 900
DELIVERIES = 50


async def _panel(
    store: Overviews, viewer: Viewing, pools: Pools, settings: AppSettings, monitor: Monitor
) -> dict[str, Any]:
    """GET /v1/overview's answer, the jobs by model and state as a table, and the rates the
    lag moves at."""
    found = await overview_api.overview(store, viewer.caller, pools, settings, WINDOW_S)
    models = sorted({c.model for c in found.jobs})
    counts = {(c.model, c.state): c.count for c in found.jobs}
    lag = monitor.snapshot()
    return {
        "overview": found,
        "models": models,
        "counts": counts,
        "job_states": [s.value for s in JobState],
        "drain_rate": lag.drain_rate,
        "arrival_rate": lag.arrival_rate,
        "blocked": sum(p.admission.blocked for p in pools),
        "poll_s": POLL_S,
    }


@router.get("/pipeline", response_class=HTMLResponse, summary="The pipeline, live")
async def pipeline_page(
    request: Request,
    viewer: Viewing,
    store: Overviews,
    pools: Pools,
    settings: AppSettings,
    monitor: Monitor,
) -> HTMLResponse:
    panel = await _panel(store, viewer, pools, settings, monitor)
    return render(request, "pipeline.html", viewer, **panel)


@router.get(
    "/pipeline/panel", response_class=HTMLResponse, summary="The pipeline panel the page polls"
)
async def pipeline_panel(
    request: Request,
    viewer: Viewing,
    store: Overviews,
    pools: Pools,
    settings: AppSettings,
    monitor: Monitor,
) -> HTMLResponse:
    panel = await _panel(store, viewer, pools, settings, monitor)
    return render(request, "pipeline_panel.html", viewer, **panel)


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
        redeliver=True,
        error=request.query_params.get("error"),
    )


@router.post(
    "/webhooks/deliveries/{delivery_id}/redeliver", summary="Redeliver a dead webhook delivery"
)
async def redeliver(delivery_id: str, viewer: Writing, hooks: Webhooks) -> Response:
    """As POST /v1/webhooks/deliveries/{id}/redeliver; back to the dead letters' list, with
    the coded error when it was refused (409 ``delivery_not_dead``, 404)."""
    target = "/ui/webhooks?state=dead"
    try:
        await webhooks_api.redeliver(delivery_id, hooks, viewer.tenant)
    except SluicegateError as exc:
        if exc.status >= 500:
            raise
        return RedirectResponse(f"{target}&error={exc.code}", status_code=303)
    return RedirectResponse(target, status_code=303)
