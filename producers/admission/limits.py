"""ASGI middleware that bounds request bodies before the app reads them: in size, and in
how slowly they may arrive."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class BodyTooLarge(HTTPException):
    """The body is over its size limit (``max_body_bytes``; ``max_batch_bytes`` for
    ``POST /v1/batches``).

    Raised from ``receive`` once a body passes its limit. An HTTPException, so that a
    framework reading the body (FastAPI) passes it on instead of answering 400."""

    code = "payload_too_large"

    def __init__(self, limit: int) -> None:
        super().__init__(413, _message(limit))


class RequestTimeout(HTTPException):
    """The body stalled for ``request_read_timeout_s``, or arrived slower than
    ``request_min_rate`` bytes a second; the connection is closed.

    Raised from ``receive``."""

    code = "request_timeout"

    def __init__(self) -> None:
        super().__init__(
            408, "the request body arrived too slowly", headers={"Connection": "close"}
        )


def _error(code: str, message: str) -> bytes:
    return json.dumps({"error": {"code": code, "message": message}}).encode()


class BodyLimit:
    """Refuse a body over ``max_bytes`` (or over the limit of its path in ``paths``) with
    413: by Content-Length, or while streaming.

    With ``read_timeout_s``, a body must also keep arriving (a slow-loris upload holds a
    connection and a task for as long as it trickles): 408 when the app waited
    ``read_timeout_s`` for its next part, or when the app's waits for it add up to more
    than ``read_timeout_s`` + received / ``min_rate`` (it came slower than ``min_rate``
    bytes a second, after a ``read_timeout_s`` of grace). Once the body is complete,
    ``receive`` is left alone: a long-poll waits on it for the client's disconnect."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        max_bytes: int,
        paths: Mapping[str, int] | None = None,
        read_timeout_s: float | None = None,
        min_rate: int = 0,
    ) -> None:
        self.app = app
        self.default_bytes = max_bytes
        self.paths = dict(paths or {})
        self.read_timeout_s = read_timeout_s
        self.min_rate = min_rate

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.paths.get(scope["path"], self.default_bytes)
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    await _respond(send, 400, "invalid_request", "bad Content-Length")
                    return
                if declared > limit:
                    await _respond(send, 413, "payload_too_large", _message(limit))
                    return
        seen = 0
        started = False
        complete = False
        waited = 0.0  # time spent waiting on the client (not on the app, which may read late)
        loop = asyncio.get_running_loop()

        async def next_part() -> Message:
            nonlocal waited
            if complete or self.read_timeout_s is None:
                return await receive()
            wait_s = self.read_timeout_s
            if self.min_rate:
                wait_s = min(wait_s, self.read_timeout_s + seen / self.min_rate - waited)
            began = loop.time()
            try:
                async with asyncio.timeout(wait_s):
                    return await receive()
            except TimeoutError:
                raise RequestTimeout from None
            finally:
                waited += loop.time() - began

        async def limited_receive() -> Message:
            nonlocal seen, complete
            message = await next_part()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise BodyTooLarge(limit)
                complete = not message.get("more_body", False)
            else:
                complete = True
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except (BodyTooLarge, RequestTimeout) as exc:
            if not started:
                await _respond(send, exc.status_code, exc.code, exc.detail, exc.headers)


def _message(limit: int) -> str:
    return f"request body is over the limit of {limit} bytes"


async def _respond(
    send: Send, status: int, code: str, message: str, headers: Mapping[str, str] | None = None
) -> None:
    body = _error(code, message)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *((k.lower().encode(), v.encode()) for k, v in (headers or {}).items()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
