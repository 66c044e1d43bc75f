"""The page's login and logout: the API key, checked as the API checks it, kept in an
HttpOnly, SameSite=Strict cookie (``producers.ui.session``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from producers.api.deps import AppSettings, Keys
from producers.ui.pages import render
from producers.ui.session import COOKIE, COOKIE_PATH, caller_of, safe_next

router = APIRouter()
# How long the browser keeps the cookie; the key's own revocation ends it sooner.
COOKIE_MAX_AGE_S = 8 * 3600
MAX_KEY = 256


@router.get("/login", response_class=HTMLResponse, summary="The login form")
async def login_form(
    request: Request, settings: AppSettings, next: str | None = None
) -> HTMLResponse:
    return render(request, "login.html", None, next=safe_next(next), error=None, auth=settings.auth)


@router.post("/login", response_class=HTMLResponse, summary="Log in with an API key")
async def login(
    request: Request,
    settings: AppSettings,
    keys: Keys,
    key: Annotated[str, Form()] = "",
    next: Annotated[str, Form()] = COOKIE_PATH,
) -> Response:
    """A known key sets the cookie and goes on to ``next``; any other shows the form again
    with the reason (401)."""
    target = safe_next(next)
    if len(key) > MAX_KEY or await caller_of(settings, keys, key) is None:
        message = (
            "That is not a tenant name."
            if settings.auth == "tenant_header"
            else "Unknown or revoked API key."
        )
        return render(
            request,
            "login.html",
            None,
            status_code=401,
            next=target,
            error=message,
            auth=settings.auth,
        )
    answer = RedirectResponse(target, status_code=303)
    answer.set_cookie(
        COOKIE,
        key.strip(),
        max_age=COOKIE_MAX_AGE_S,
        path=COOKIE_PATH,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return answer


@router.post("/logout", summary="Log out")
async def logout() -> Response:
    """Forget the cookie. Not CSRF-checked: the worst another site can do is log you out,
    and SameSite=Strict keeps even that from happening."""
    answer = RedirectResponse(f"{COOKIE_PATH}/login", status_code=303)
    answer.delete_cookie(COOKIE, path=COOKIE_PATH, httponly=True, samesite="strict")
    return answer
