"""The client's side of the submit channel, against small WebSocket servers that answer as
the API may: a frame not read before a 1001 goes again by HTTP, a broken connection is
``Unreachable``, a refused handshake is the API's answer, and no channel means HTTP."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from http import HTTPStatus
from typing import Any

import httpx
import pytest
from websockets.asyncio.server import ServerConnection, serve
from websockets.http11 import Request, Response

from client.api import ApiError, AsyncClient, Unreachable
from client.channel import SubmitChannel
from schemas.jobs import JobKind

ACCEPTED = {
    "id": "0197a2b0-0000-7000-8000-000000000001",
    "state": "queued",
    "deadline": "2026-11-28T20:00:00Z",
    "created_at": "2026-11-28T19:00:00Z",
    "status_url": "/v1/jobs/0197a2b0-0000-7000-8000-000000000001",
}

Handler = Callable[[ServerConnection], Awaitable[None]]
Refuse = Callable[[ServerConnection, Request], Response | None]


@asynccontextmanager
async def ws_server(handler: Handler, refuse: Refuse | None = None) -> AsyncIterator[int]:
    async with serve(handler, "127.0.0.1", 0, process_request=refuse) as server:
        yield next(iter(server.sockets)).getsockname()[1]


def over_http(posted: list[bytes]) -> httpx.MockTransport:
    def answer(request: httpx.Request) -> httpx.Response:
        posted.append(request.content)
        return httpx.Response(202, json=ACCEPTED)

    return httpx.MockTransport(answer)


def client(port: int, posted: list[bytes], **options: Any) -> AsyncClient:
    return AsyncClient(
        f"http://127.0.0.1:{port}", transport=over_http(posted), channel=True, **options
    )


async def test_answers_come_over_the_channel() -> None:
    async def answer(ws: ServerConnection) -> None:
        async for message in ws:
            frame = json.loads(message)
            await ws.send(json.dumps({"ref": frame["ref"], "status": 202, "body": ACCEPTED}))

    posted: list[bytes] = []
    async with ws_server(answer) as port, client(port, posted) as c:
        for _ in range(3):
            assert (await c.submit(JobKind.SUMMARIZE, "text")).id == ACCEPTED["id"]
    assert posted == []


async def test_a_frame_not_read_before_going_away_goes_again_by_http() -> None:
    async def going_away(ws: ServerConnection) -> None:
        await ws.recv()
        await ws.close(1001, "stopping")  # a frame read is answered first; this one was not

    posted: list[bytes] = []
    async with ws_server(going_away) as port, client(port, posted) as c:
        accepted = await c.submit(JobKind.SUMMARIZE, "text")
    assert accepted.id == ACCEPTED["id"]
    assert [json.loads(p)["input"] for p in posted] == ["text"]


async def test_a_connection_that_breaks_leaves_the_submit_unknown() -> None:
    async def breaks(ws: ServerConnection) -> None:
        await ws.recv()
        ws.transport.abort()

    posted: list[bytes] = []
    async with ws_server(breaks) as port, client(port, posted) as c:
        with pytest.raises(Unreachable):
            await c.submit(JobKind.SUMMARIZE, "text")
    assert posted == []  # not sent again: it may have been stored


async def test_a_refused_handshake_is_the_apis_answer() -> None:
    def unauthorized(ws: ServerConnection, request: Request) -> Response:
        body = {"error": {"code": "unauthorized", "message": "unknown or revoked API key"}}
        response = ws.respond(HTTPStatus.UNAUTHORIZED, json.dumps(body))
        response.headers["Content-Type"] = "application/json"
        return response

    async def never(ws: ServerConnection) -> None:
        raise AssertionError("not accepted")

    posted: list[bytes] = []
    async with ws_server(never, unauthorized) as port, client(port, posted) as c:
        with pytest.raises(ApiError) as refused:
            await c.submit(JobKind.SUMMARIZE, "text")
    assert (refused.value.status, refused.value.code) == (401, "unauthorized")
    assert posted == []


async def test_a_server_without_the_channel_gets_http_from_then_on() -> None:
    handshakes = 0

    def not_found(ws: ServerConnection, request: Request) -> Response:
        nonlocal handshakes
        handshakes += 1
        return ws.respond(HTTPStatus.NOT_FOUND, "no such route")

    async def never(ws: ServerConnection) -> None:
        raise AssertionError("not accepted")

    posted: list[bytes] = []
    async with ws_server(never, not_found) as port, client(port, posted) as c:
        for _ in range(3):
            await c.submit(JobKind.SUMMARIZE, "text")
    assert (handshakes, len(posted)) == (1, 3)


async def test_nothing_listening_is_unreachable() -> None:
    async with ws_server(lambda ws: ws.wait_closed()) as port:
        pass  # closed: nothing listens on the port now
    with pytest.raises(Unreachable):
        await SubmitChannel(f"http://127.0.0.1:{port}", {}, 5.0).submit(b"{}")


def test_the_channel_is_under_the_base_url() -> None:
    assert (
        SubmitChannel("https://api.example/sg/", {}, 1)._url
        == "wss://api.example/sg/v1/jobs/channel"
    )
    assert (
        SubmitChannel("http://127.0.0.1:8000", {}, 1)._url == "ws://127.0.0.1:8000/v1/jobs/channel"
    )
