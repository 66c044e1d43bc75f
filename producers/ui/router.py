"""The web page's routes under /ui, its static files (htmx and a classless stylesheet,
vendored), and ``/`` sending a browser there. Swagger stays at /docs."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI
from fastapi.responses import RedirectResponse
from fastapi.staticfiles import StaticFiles

from producers.ui import auth, batches, jobs, pipeline
from producers.ui.pages import STATIC
from producers.ui.session import COOKIE_PATH

router = APIRouter(prefix=COOKIE_PATH, include_in_schema=False)
router.include_router(auth.router)
router.include_router(jobs.router)
router.include_router(batches.router)
router.include_router(pipeline.router)


@router.get("")
async def home() -> RedirectResponse:
    return RedirectResponse(f"{COOKIE_PATH}/jobs", status_code=303)


root = APIRouter(include_in_schema=False)


@root.get("/")
async def index() -> RedirectResponse:
    return RedirectResponse(COOKIE_PATH, status_code=303)


def install(app: FastAPI) -> None:
    """Serve the page on ``app``."""
    app.include_router(router)
    app.include_router(root)
    app.mount(f"{COOKIE_PATH}/static", StaticFiles(directory=STATIC), name="ui-static")
