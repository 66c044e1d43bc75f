"""The HTTP API's app factory: the lifespan, the body limits, the error handlers and the
routers of jobs, health and metrics, batches, files, webhooks, the overview and OpenAI's
synchronous completions and models; and the web page at /ui."""

from __future__ import annotations

from fastapi import FastAPI
from sqlalchemy.ext.asyncio import AsyncEngine

from plumbing.settings import Settings
from producers.admission.limits import BodyLimit
from producers.api import (
    batches,
    bulk,
    channel,
    completions,
    documents,
    errors,
    fast_submit,
    files,
    health,
    jobs,
    overview,
    webhooks,
)
from producers.api.lifespan import Lifespan
from producers.lag.monitor import LagSource
from producers.ui import router as ui

MULTIPART_OVERHEAD = 65_536


def create_app(
    settings: Settings, *, engine: AsyncEngine | None = None, lag_source: LagSource | None = None
) -> FastAPI:
    """The API on ``settings``; ``engine``: the database (None: one of the settings', made
    and disposed by the app); ``lag_source``: the lag (None: the dispatch topic's)."""
    lifespan = Lifespan(settings=settings, engine=engine, lag_source=lag_source)
    app = FastAPI(title="Sluicegate", version="0.1.0", lifespan=lifespan)
    app.state.settings = settings
    app.state.documents = documents.Extractor.of(settings)
    app.add_middleware(
        BodyLimit,
        max_bytes=settings.max_body_bytes,
        paths={
            "/v1/batches": settings.max_batch_bytes,
            # The file, its purpose and the multipart boundaries around them.
            "/v1/files": settings.max_file_bytes + MULTIPART_OVERHEAD,
            "/v1/documents": settings.document_max_bytes + MULTIPART_OVERHEAD,
        },
        read_timeout_s=settings.request_read_timeout_s,
        min_rate=settings.request_min_rate,
    )
    errors.install(app)
    # The job routes first: a request is matched against the routes in order, and the
    # single submit is the busiest of them.
    app.include_router(jobs.router)
    app.include_router(bulk.router)
    app.include_router(channel.router)
    app.include_router(health.router)
    app.include_router(batches.router)
    app.include_router(files.router)
    app.include_router(documents.router)
    app.include_router(webhooks.router)
    app.include_router(completions.router)
    app.include_router(overview.router)
    ui.install(app)
    if settings.api_fast_submit:
        fast_submit.install(app)
    return app
