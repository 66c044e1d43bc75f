"""The page's templates (Jinja2, in ``templates/``) and the helpers they format with."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fastapi import Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.routing import APIRoute
from fastapi.templating import Jinja2Templates

from producers.ui.session import CSRF_FIELD, CSRF_HEADER, LoginRequired, Viewer, login_url
from schemas.errors import SluicegateError

HERE = Path(__file__).parent
STATIC = HERE / "static"
templates = Jinja2Templates(directory=HERE / "templates")


def when(value: datetime | int | None) -> str:
    """A time as the page shows it: UTC, to the second."""
    if value is None:
        return "—"
    if isinstance(value, int):
        value = datetime.fromtimestamp(value, UTC)
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def between(start: datetime | None, end: datetime | None) -> str:
    """The time from ``start`` to ``end`` (now while it runs), as the page shows it."""
    if start is None:
        return ""
    seconds = ((end or datetime.now(UTC)) - start).total_seconds()
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.1f} min"


templates.env.filters["when"] = when
templates.env.globals["between"] = between
templates.env.globals["CSRF_FIELD"] = CSRF_FIELD
templates.env.globals["CSRF_HEADER"] = CSRF_HEADER


def render(
    request: Request, name: str, viewer: Viewer | None, status_code: int = 200, **context: Any
) -> HTMLResponse:
    """``templates/<name>`` with the viewer (None on the login form) and ``context``."""
    return templates.TemplateResponse(
        request, name, {"viewer": viewer, **context}, status_code=status_code
    )


class PageRoute(APIRoute):
    """A page's route: no login is a redirect to the login form (``HX-Redirect`` for an
    htmx request, whose answer would otherwise land inside the page), and a coded error
    (no such job, a job that already ended...) is a page that says so, not JSON."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def page(request: Request) -> Response:
            try:
                return await handler(request)
            except LoginRequired as exc:
                target = login_url(exc.next_path)
                if request.headers.get("HX-Request") == "true":
                    return Response(status_code=204, headers={"HX-Redirect": target})
                return RedirectResponse(target, status_code=303)
            except SluicegateError as exc:
                if exc.status >= 500:
                    raise
                return render(request, "error.html", None, status_code=exc.status, error=exc)

        return page
