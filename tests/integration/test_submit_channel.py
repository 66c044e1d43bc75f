"""The submit channel (``/v1/jobs/channel``) under a real uvicorn, on a real, migrated
PostgreSQL and broker: each frame answered as ``POST /v1/jobs`` answers its job, the
project's client sending a lone caller's submits over it, the key checked at the handshake
and again for each frame, a server without the channel met with HTTP, and a stopping API
answering every frame it read before it closes."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
import uvicorn
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine
from websockets.asyncio.client import connect

from client.api import ApiError, AsyncClient
from client.sync import Client
from plumbing.settings import Settings
from producers.api import channel
from producers.api.app import create_app
from producers.api.server import ApiServer
from producers.tenancy.keys import key_id
from producers.tenancy.repository import KeyStore
from schemas.jobs import JobKind
from schemas.tables import jobs
from tests.integration.serving import serving, until

TENANT = {"X-Sluicegate-Tenant": "acme"}
DOC = "A channel answers each frame once its job is durable."


def job(**fields: Any) -> dict[str, Any]:
    return {"kind": "summarize", "input": DOC, "ttl_s": 600, **fields}


async def stored(db: AsyncEngine) -> set[str]:
    async with db.connect() as conn:
        return {str(i) for i in (await conn.scalars(select(jobs.c.id)))}


async def frames(port: int, bodies: list[Any], headers: dict[str, str]) -> list[dict[str, Any]]:
    """Each body sent as a frame's job (a str as the frame itself), the answers by ref."""
    async with connect(f"ws://127.0.0.1:{port}{channel.PATH}", additional_headers=headers) as ws:
        for ref, body in enumerate(bodies):
            await ws.send(body if isinstance(body, str) else json.dumps({"ref": ref, "job": body}))
        answers = [json.loads(await ws.recv()) for _ in bodies]
    return sorted(answers, key=lambda a: (a["ref"] is None, a["ref"] or 0))


async def test_each_frame_is_answered_as_post_answers_it(
    settings: Settings, db: AsyncEngine
) -> None:
    bodies = [
        job(idempotency_key="k1"),
        job(idempotency_key="k1"),  # the replay: the same job, 200
        job(idempotency_key="k1", input="another document"),  # the key's other request
        job(input=""),
        job(kind="nope"),
        job(ttl_s=10**9),
    ]
    async with serving(create_app(settings, engine=db)) as port:
        # The first alone: frames are taken at once, so the key's first job must be stored.
        answers = await frames(port, bodies[:1], TENANT)
        answers += [{**a, "ref": a["ref"] + 1} for a in await frames(port, bodies[1:], TENANT)]
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", headers=TENANT) as http:
            posted = [await http.post("/v1/jobs", json=b) for b in bodies[1:]]
    first = answers[0]
    assert first["status"] == 202
    assert first["headers"]["location"] == f"/v1/jobs/{first['body']['id']}"
    for answer, response in zip(answers[1:], posted, strict=True):
        assert answer["status"] == response.status_code, answer
        if response.status_code < 300:  # the replay: the first frame's job, as POST says
            assert answer["body"] == response.json() == {**first["body"], "state": "queued"}
            assert answer["headers"]["idempotent-replayed"] == "true"
        else:
            assert answer["body"]["error"]["code"] == response.json()["error"]["code"]
    assert await stored(db) == {first["body"]["id"]}


async def test_a_frame_that_is_not_one_is_told_why(settings: Settings, db: AsyncEngine) -> None:
    async with serving(create_app(settings, engine=db)) as port:
        answers = await frames(port, ["not json", '{"job": {}}', '{"ref": 1, "job": 3}'], TENANT)
    said = [(a["ref"], a["status"], a["body"]["error"]["code"]) for a in answers]
    assert sorted(said, key=str) == sorted(
        [(1, 422, "invalid_body"), (None, 400, "invalid_json"), (None, 422, "invalid_request")],
        key=str,
    )
    assert await stored(db) == set()


async def test_a_lone_caller_submits_over_the_channel(settings: Settings, db: AsyncEngine) -> None:
    async with (
        serving(create_app(settings, engine=db)) as port,
        AsyncClient(f"http://127.0.0.1:{port}", tenant="acme") as client,
    ):
        ids = [
            (await client.submit(JobKind.SUMMARIZE, f"{DOC} {n}", ttl_s=600)).id for n in range(20)
        ]
        assert len(channel.OPEN.open) == 1  # one channel carried them all
        assert client._channel is not None
        assert not client._channel.refused
    assert await stored(db) == set(ids)
    await until(lambda: not channel.OPEN.open)  # the client's close ended it


async def test_the_blocking_client_loops_over_the_channel(
    settings: Settings, db: AsyncEngine
) -> None:
    async with serving(create_app(settings, engine=db)) as port:

        def loop() -> list[str]:
            with Client(f"http://127.0.0.1:{port}", tenant="acme") as client:
                return [client.submit("summarize", f"{DOC} {n}", ttl_s=600).id for n in range(20)]

        ids = await asyncio.to_thread(loop)
    assert await stored(db) == set(ids)


async def test_the_key_is_checked_at_the_handshake_and_for_each_frame(
    settings: Settings, db: AsyncEngine
) -> None:
    keyed = settings.model_copy(update={"auth": "api_key", "api_key_cache_s": 0})
    store = KeyStore(db)
    key = await store.create("acme")
    async with serving(create_app(keyed, engine=db)) as port:
        url = f"http://127.0.0.1:{port}"
        for wrong in (None, "sk_nope"):
            async with AsyncClient(url, api_key=wrong) as client:
                with pytest.raises(ApiError) as refused:
                    await client.submit(JobKind.SUMMARIZE, DOC, ttl_s=600)
                assert (refused.value.status, refused.value.code) == (401, "unauthorized")
        async with AsyncClient(url, api_key=key) as client:
            accepted = await client.submit(JobKind.SUMMARIZE, DOC, ttl_s=600)
            made = key_id(key)
            assert made is not None
            assert await store.revoke(made)
            with pytest.raises(ApiError) as revoked:
                await client.submit(JobKind.SUMMARIZE, DOC, ttl_s=600)
            assert (revoked.value.status, revoked.value.code) == (401, "unauthorized")
    assert await stored(db) == {accepted.id}


async def test_a_refused_handshake_is_not_logged_as_the_servers_error(
    settings: Settings, db: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    keyed = settings.model_copy(update={"auth": "api_key", "api_key_cache_s": 0})
    denied = channel.OPEN.denied  # left by servers of other tests, not the API's own
    async with served_by_api_server(keyed, db) as (port, _):
        for _ in range(3):
            async with AsyncClient(f"http://127.0.0.1:{port}", api_key="sk_nope") as client:
                with pytest.raises(ApiError):
                    await client.submit(JobKind.SUMMARIZE, DOC, ttl_s=600)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == []
    assert channel.OPEN.denied == denied  # each line dropped was a denial's


async def test_a_server_without_the_channel_is_met_with_http(
    settings: Settings, db: AsyncEngine
) -> None:
    async with (
        serving(create_app(settings, engine=db), ws="none") as port,
        AsyncClient(f"http://127.0.0.1:{port}", tenant="acme") as client,
    ):
        ids = [(await client.submit(JobKind.SUMMARIZE, DOC, ttl_s=600)).id for _ in range(3)]
        assert client._channel is not None
        assert client._channel.refused
    assert await stored(db) == set(ids)


async def test_a_stopping_api_answers_every_frame_it_read(
    settings: Settings, db: AsyncEngine
) -> None:
    """Frames keep coming while the server stops: each one it read is answered (202), the
    channel closes with 1001, and no job is stored that was not answered."""
    answers: list[dict[str, Any]] = []
    async with served_by_api_server(settings, db) as (port, server):
        code = await frames_while_stopping(port, server, answers)
    assert code == channel.GOING_AWAY
    assert 20 <= len(answers) < 2000
    assert {a["status"] for a in answers} == {202}
    assert await stored(db) == {a["body"]["id"] for a in answers}


@asynccontextmanager
async def served_by_api_server(
    settings: Settings, db: AsyncEngine
) -> AsyncIterator[tuple[int, ApiServer]]:
    """The app under the API's own server (``ApiServer``), stopped as SIGTERM stops it."""
    config = uvicorn.Config(
        create_app(settings, engine=db), host="127.0.0.1", port=0, log_config=None
    )
    server = ApiServer(config)
    serve = asyncio.create_task(server.serve())
    try:
        await until(lambda: server.started or serve.done(), within_s=10)
        yield server.servers[0].sockets[0].getsockname()[1], server
    finally:
        server.should_exit = True
        await serve


async def frames_while_stopping(
    port: int, server: ApiServer, answers: list[dict[str, Any]]
) -> int | None:
    """Frames sent on and on; the server told to stop once 20 are answered; its close code."""
    async with connect(f"ws://127.0.0.1:{port}{channel.PATH}", additional_headers=TENANT) as ws:

        async def send() -> None:
            for ref in range(2000):
                await ws.send(json.dumps({"ref": ref, "job": job(input=f"{DOC} {ref}")}))
                await asyncio.sleep(0)

        sending = asyncio.create_task(send())
        async for message in ws:
            answers.append(json.loads(message))
            if len(answers) == 20:
                server.should_exit = True  # as SIGTERM does
        code = ws.close_code
    sending.cancel()
    return code


async def test_a_frame_that_fails_unexpectedly_is_a_500_and_the_channel_goes_on(
    settings: Settings, db: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = channel.answer_of

    async def failing(*args: Any) -> dict[str, Any]:
        if args[1]["input"] == "boom":
            raise RuntimeError("a bug")
        return await real(*args)

    monkeypatch.setattr(channel, "answer_of", failing)
    async with serving(create_app(settings, engine=db)) as port:
        answers = await frames(port, [job(input="boom"), job()], TENANT)
    assert [(a["ref"], a["status"]) for a in answers] == [(0, 500), (1, 202)]
    assert answers[0]["body"]["error"]["code"] == "internal_error"
