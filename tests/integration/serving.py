"""The API under a real uvicorn server, and a caller that hangs up on it."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI
from sqlalchemy.ext.asyncio import AsyncEngine

from plumbing.settings import Settings
from producers.api.app import create_app


async def until(check: Callable[[], bool], within_s: float = 5.0) -> None:
    async with asyncio.timeout(within_s):
        while not check():
            await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def serve(settings: Settings, db: AsyncEngine) -> AsyncIterator[httpx.AsyncClient]:
    """The API app, started (lifespan included), behind an in-process client."""
    app = create_app(settings, engine=db)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://sg") as client:
            yield client


@contextlib.asynccontextmanager
async def serving(
    app: FastAPI, server_type: type[uvicorn.Server] = uvicorn.Server, **options: Any
) -> AsyncIterator[int]:
    """The app under a real uvicorn on a free local port (its lifespan included);
    ``options``: more of uvicorn's ``Config``."""
    config = uvicorn.Config(
        app, host="127.0.0.1", port=0, lifespan="on", log_config=None, access_log=False, **options
    )
    server = server_type(config)
    task = asyncio.create_task(server.serve())
    try:
        await until(lambda: server.started or task.done(), within_s=10)
        assert server.started, "uvicorn did not start"
        yield server.servers[0].sockets[0].getsockname()[1]
    finally:
        server.should_exit = True
        await task


async def post_then_hang_up(
    port: int, body: dict[str, Any], hang_up: Callable[[], bool], within_s: float = 5.0
) -> None:
    """POST /v1/jobs?wait=30 over a raw socket, then close it once ``hang_up()`` holds."""
    payload = json.dumps(body).encode()
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"POST /v1/jobs?wait=30 HTTP/1.1\r\nHost: sg\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(payload)}\r\n\r\n".encode()
        + payload
    )
    await writer.drain()
    await until(hang_up, within_s)
    writer.close()
    await writer.wait_closed()
