"""Health and metrics: ``/healthz`` (the database answers) and Prometheus' ``/metrics``."""

from __future__ import annotations

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST

from plumbing.metrics import exposition
from producers.api import openapi
from producers.api.deps import Jobs

router = APIRouter()


@router.get(
    "/healthz",
    summary="Health",
    description="200 while the database answers; 503 database_unavailable otherwise.",
    responses=openapi.errors(503),
)
async def healthz(repo: Jobs) -> dict[str, str]:
    await repo.ping()
    return {"status": "ok"}


@router.get("/metrics", include_in_schema=False)
async def metrics() -> Response:
    return Response(exposition("api"), media_type=CONTENT_TYPE_LATEST)
