"""The web page at /ui over HTTP on the real database: the login and its cookie, the
redirects without one, a tenant's key scoped to its tenant, and the cancel's CSRF checks.
(tests/e2e/test_ui.py drives the same page in a browser.)"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime

import httpx
import pytest
from sqlalchemy import insert, select
from sqlalchemy.ext.asyncio import AsyncEngine

from plumbing.settings import Settings
from producers.tenancy.repository import KeyStore
from producers.ui.session import COOKIE, csrf_token
from schemas.tables import webhook_deliveries
from tests.integration.serving import serve

JOB = {"kind": "summarize", "input": "The page shows every job.", "ttl_s": 600}
ORIGIN = "http://sg"


@pytest.fixture
async def api(settings: Settings, db: AsyncEngine) -> AsyncIterator[httpx.AsyncClient]:
    keyed = settings.model_copy(update={"auth": "api_key", "api_key_cache_s": 0})
    async with serve(keyed, db) as client:
        yield client


async def submitted(api: httpx.AsyncClient, key: str) -> str:
    made = await api.post("/v1/jobs", json=JOB, headers={"Authorization": f"Bearer {key}"})
    assert made.status_code == 202, made.text
    job_id: str = made.json()["id"]
    return job_id


async def test_every_page_needs_the_login(api: httpx.AsyncClient) -> None:
    assert (await api.get("/")).headers["location"] == "/ui"
    for path in ("/ui/jobs?state=queued", "/ui/batches", "/ui/pipeline", "/ui/webhooks"):
        answer = await api.get(path)
        assert answer.status_code == 303, path
        assert answer.headers["location"].startswith("/ui/login?next=/ui/"), path
    # An htmx poll is told to load the login page, not given it as a fragment.
    polled = await api.get("/ui/pipeline/panel", headers={"HX-Request": "true"})
    assert polled.status_code == 204
    assert polled.headers["HX-Redirect"].startswith("/ui/login")
    assert (await api.get("/ui/static/htmx.min.js")).status_code == 200
    assert (await api.get("/docs")).status_code == 200


async def test_a_wrong_key_shows_the_form_again(api: httpx.AsyncClient) -> None:
    for key in ("", "sk_nope", "sk_0123456789ab_" + "x" * 40, "k" * 5000):
        answer = await api.post("/ui/login", data={"key": key, "next": "/ui/jobs"})
        assert answer.status_code == 401, key[:20]
        assert "Unknown or revoked API key" in answer.text
        assert 'name="key"' in answer.text
        assert COOKIE not in answer.headers.get("set-cookie", "")


async def test_a_tenants_key_sees_its_own_jobs_and_cancels_only_with_the_token(
    api: httpx.AsyncClient, db: AsyncEngine
) -> None:
    keys = KeyStore(db)
    mine, theirs = await keys.create("mine"), await keys.create("theirs")
    own, other = await submitted(api, mine), await submitted(api, theirs)

    logged = await api.post("/ui/login", data={"key": mine, "next": "/ui/jobs"})
    assert logged.status_code == 303
    assert logged.headers["location"] == "/ui/jobs"
    cookie = logged.headers["set-cookie"].lower()
    for attribute in ("httponly", "samesite=strict", "path=/ui"):
        assert attribute in cookie
    assert "secure" not in cookie  # plain http here

    listed = await api.get("/ui/jobs")
    assert listed.status_code == 200
    assert own[-12:] in listed.text
    assert other[-12:] not in listed.text
    refused = await api.get("/ui/jobs?tenant=theirs")
    assert refused.status_code == 403
    assert "operator_only" in refused.text
    assert (await api.get(f"/ui/jobs/{other}")).status_code == 404

    token = csrf_token(mine)
    cancel = f"/ui/jobs/{own}/cancel"
    for data, origin in (({}, ORIGIN), ({"csrf": token}, "http://evil.example")):
        forged = await api.post(cancel, data=data, headers={"Origin": origin})
        assert forged.status_code == 403
        assert "csrf_refused" in forged.text
    still = (await api.get(f"/ui/jobs/{own}")).text
    assert 'state-queued">queued<' in still or 'state-dispatched">dispatched<' in still

    done = await api.post(cancel, data={"csrf": token}, headers={"Origin": ORIGIN})
    assert done.status_code == 303
    assert done.headers["location"] == f"/ui/jobs/{own}"
    page = await api.get(f"/ui/jobs/{own}")
    assert 'id="job-state" class="state-cancelled">cancelled<' in page.text
    again = await api.post(cancel, data={"csrf": token}, headers={"Origin": ORIGIN})
    assert again.headers["location"] == f"/ui/jobs/{own}?error=job_terminal"

    out = await api.post("/ui/logout")
    assert out.status_code == 303
    assert (await api.get("/ui/jobs")).status_code == 303


async def test_a_dead_delivery_is_redelivered_from_the_webhooks_page(
    api: httpx.AsyncClient, db: AsyncEngine
) -> None:
    key = await KeyStore(db).create("hooks")
    dead = {
        "id": "msg_ui_dead",
        "tenant": "hooks",
        "subject": "00000000-0000-0000-0000-000000000001",
        "event_type": "job.succeeded",
        "url": "https://receiver.example/hook",
        "body": "{}",
        "state": "dead",
        "attempts": 2,
        "last_status": 503,
        "finished_at": datetime.now(UTC),
    }
    async with db.begin() as conn:
        await conn.execute(insert(webhook_deliveries).values(dead))
    assert (await api.post("/ui/login", data={"key": key, "next": "/ui"})).status_code == 303

    page = await api.get("/ui/webhooks?state=dead")
    action = "/ui/webhooks/deliveries/msg_ui_dead/redeliver"
    assert f'action="{action}"' in page.text  # the button is shown for a dead delivery
    forged = await api.post(action, data={}, headers={"Origin": ORIGIN})
    assert (forged.status_code, "csrf_refused" in forged.text) == (403, True)

    token = {"csrf": csrf_token(key)}
    done = await api.post(action, data=token, headers={"Origin": ORIGIN})
    assert (done.status_code, done.headers["location"]) == (303, "/ui/webhooks?state=dead")
    async with db.connect() as conn:
        state = await conn.scalar(
            select(webhook_deliveries.c.state).where(webhook_deliveries.c.id == "msg_ui_dead")
        )
    assert state == "pending"  # due again: the dispatcher sends it now
    # No dispatcher runs here: the pipeline panel shows it waiting, due and not claimed.
    panel = (await api.get("/ui/pipeline/panel")).text
    assert '<td id="deliveries-pending">1</td>' in panel
    assert '<td id="deliveries-due">1</td>' in panel
    assert " s ago</span>" in panel  # how long it has been due
    again = await api.post(action, data=token, headers={"Origin": ORIGIN})
    assert again.headers["location"] == "/ui/webhooks?state=dead&error=delivery_not_dead"
    missing = await api.post(
        "/ui/webhooks/deliveries/msg_nope/redeliver", data=token, headers={"Origin": ORIGIN}
    )
    assert missing.headers["location"].endswith("error=delivery_not_found")
