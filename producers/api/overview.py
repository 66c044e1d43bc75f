"""GET /v1/overview: admission and the lag, jobs by model and state, drops by reason, the
workers with their capacity, and the webhook deliveries waiting (``schemas.overview``)."""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Annotated

from fastapi import APIRouter, Query

from producers.api import openapi
from producers.api.deps import AppSettings, CallerOf, Overviews, Pools
from producers.overview.repository import DeliveryCounts
from schemas.overview import (
    AdmissionView,
    DeliveriesView,
    DropCount,
    JobCount,
    Overview,
    PoolAdmissionView,
    WorkerView,
)

DEFAULT_WINDOW_S = 300
MAX_WINDOW_S = 86_400
# A worker row not written for this many report intervals is shown as stale.
STALE_INTERVALS = 3
# A delivery due (and not claimed) this long shows the dispatchers behind, as the alert
# SluicegateWebhooksBehind (deploy/prometheus/alerts.yml) judges them.
BEHIND_S = 60.0

router = APIRouter(tags=["overview"])


@router.get(
    "/v1/overview",
    response_model=Overview,
    responses=openapi.errors(401, 422, 503),
    summary="The pipeline at a glance",
)
async def overview(
    store: Overviews,
    caller: CallerOf,
    pools: Pools,
    settings: AppSettings,
    window_s: Annotated[
        int, Query(ge=1, le=MAX_WINDOW_S, description="Ended jobs and drops of this many s")
    ] = DEFAULT_WINDOW_S,
) -> Overview:
    """Admission as a normal-priority submit meets it, the jobs by model and state (those
    not ended, and those ended within ``window_s``), the drops by reason within it, the
    workers that report themselves, and the webhook deliveries pending and due. Jobs,
    drops and deliveries are the caller's tenant's, every tenant's for an operator key."""
    scope = None if caller.operator else caller.tenant
    stale_s = STALE_INTERVALS * settings.worker_report_s
    return Overview(
        generated_at=time.time(),
        window_s=window_s,
        operator=caller.operator,
        admission=AdmissionView(**asdict(pools.first.admission.status())),
        pools=[
            PoolAdmissionView(model=p.pool.model, **asdict(p.admission.status())) for p in pools
        ],
        jobs=[
            JobCount(model=m, state=s, count=n)
            for m, s, n in await store.job_counts(scope, window_s)
        ],
        drops=[
            DropCount(state=s, reason=r, count=n) for s, r, n in await store.drops(scope, window_s)
        ],
        workers=[
            WorkerView(
                id=w.id,
                model=w.model,
                engine=w.engine,
                capacity=w.capacity,
                running=w.running,
                kv_usage=w.kv_usage,
                last_seen_s=round(w.age_s, 3),
                stale=w.age_s > stale_s,
            )
            for w in await store.workers()
        ],
        deliveries=_deliveries(await store.deliveries(scope)),
    )


def _deliveries(counts: DeliveryCounts) -> DeliveriesView:
    oldest = counts.oldest_due_s
    return DeliveriesView(
        pending=counts.pending,
        due=counts.due,
        oldest_due_s=None if oldest is None else round(oldest, 3),
        behind=oldest is not None and oldest > BEHIND_S,
    )
