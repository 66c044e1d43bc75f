"""ASGI middleware that bounds request bodies before the app reads them."""

from __future__ import annotations

import json
from collections.abc import Mapping

from starlette.types import ASGIApp, Message, Receive, Scope, Send


class BodyTooLarge(Exception):
    pass


def _error(code: str, message: str) -> bytes:
    return json.dumps({"error": {"code": code, "message": message}}).encode()


class BodyLimit:
    """Refuse a body over ``max_bytes`` (or over the limit of its path in ``paths``) with
    413: by Content-Length, or while streaming."""

    def __init__(
        self, app: ASGIApp, *, max_bytes: int, paths: Mapping[str, int] | None = None
    ) -> None:
        self.app = app
        self.default_bytes = max_bytes
        self.paths = dict(paths or {})

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

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise BodyTooLarge
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except BodyTooLarge:
            if not started:
                await _respond(send, 413, "payload_too_large", _message(limit))


def _message(limit: int) -> str:
    return f"request body is over the limit of {limit} bytes"


async def _respond(send: Send, status: int, code: str, message: str) -> None:
    body = _error(code, message)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
