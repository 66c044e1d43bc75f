"""``/v1/jobs/channel``: single submits over one WebSocket, each answered as ``POST /v1/jobs``
would answer it, once its job is durable.

Why: a caller submitting one job after another pays HTTP's whole request path for each
(parsing, the middleware, routing, the caller's key) and waits for it; on both sides that
path was most of a lone submit's time (docs/performance.md). On a channel it is paid once.
The Python client sends a lone ``submit()`` this way; any WebSocket client can.

The handshake carries the caller as a request does (``Authorization: Bearer <key>``, or
``X-Sluicegate-Tenant`` with ``auth = tenant_header``); a refused one is answered with the
same HTTP error (401 ``unauthorized``).

A frame is ``{"ref": R, "job": {...}}``: ``R`` an integer or a string of the caller's, the
job a ``POST /v1/jobs`` body (its idempotency key in it). Its answer is ``{"ref": R,
"status": ..., "body": ..., "headers": ...}``: what the route would answer (202, 200 for a
replay, 409, 422, 429 or 503 with ``retry-after``), sent once the job is committed. A frame
that is not JSON is answered ``{"ref": null, "status": 400, ...}`` (``invalid_json``); one
without a ``ref`` or a ``job`` 422 (``invalid_request``); one over ``max_body_bytes`` 413.
Frames are taken concurrently (at most ``max_bulk_jobs`` at once; the rest wait in the
socket), so their jobs share the submit groups' transactions, and are answered as they end,
in any order. The caller's key is looked up again for each frame, as for each request
(``api_key_cache_s``): a revoked key's frame is answered 401 and the channel closes (1008).

When the API stops, it reads no more frames, answers every frame it read, and closes the
channel with 1001 (going away): a frame not answered then was not read, nothing was stored
for it, and it may be sent again. Any other end of the connection leaves the frames in
flight unanswered, as a broken connection leaves an HTTP request (an idempotency key makes
sending them again safe).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, WebSocket
from starlette.datastructures import State
from starlette.websockets import WebSocketDisconnect

from producers.admission.limits import BodyTooLarge
from producers.api.bulk import answer_of, item_of
from producers.api.deps import current_caller
from producers.api.errors import answer_for, error_response
from schemas import constants
from schemas.errors import InvalidRequest, SluicegateError, Unauthorized

log = logging.getLogger(__name__)
router = APIRouter()

PATH = "/v1/jobs/channel"
GOING_AWAY = 1001  # the server stops: every frame read was answered
POLICY = 1008  # the key was refused
DENIAL = "websocket.http.response"  # the ASGI extension that refuses a handshake with HTTP
# A frame's room around its job (the ref and the wrapper), over the body limit of a job.
FRAME_OVERHEAD = 1024


class Channels:
    """The channels open in this process, for the server to drain before it stops."""

    def __init__(self) -> None:
        self.open: set[ServedChannel] = set()
        self.denied = 0  # handshakes refused with an HTTP answer, not yet logged by uvicorn

    async def drain_all(self, timeout_s: float) -> None:
        """Stop reading every channel, answer the frames read, close with 1001."""
        if self.open:
            async with asyncio.timeout(timeout_s):
                await asyncio.gather(*(c.drain() for c in list(self.open)))


OPEN = Channels()


@router.websocket(PATH)
async def channel(websocket: WebSocket) -> None:
    state: State = websocket.app.state
    authorization = websocket.headers.get("authorization")
    tenant_header = websocket.headers.get(constants.HEADER_TENANT)
    try:
        await current_caller(state.settings, state.keys, authorization, tenant_header)
    except SluicegateError as exc:
        answer = await answer_for(websocket, exc)
        assert answer is not None
        if DENIAL in websocket.scope.get("extensions", {}):
            OPEN.denied += 1  # see producers.api.server.DenialsSent
            await websocket.send_denial_response(answer)
        else:  # a server without denial responses: the reason in the close
            await websocket.close(POLICY, exc.message[:120])
        return
    await websocket.accept()
    await ServedChannel(websocket, state, authorization, tenant_header).run()


class ServedChannel:
    def __init__(
        self,
        websocket: WebSocket,
        state: State,
        authorization: str | None,
        tenant_header: str | None,
    ) -> None:
        self._ws = websocket
        self._state = state
        self._credentials = (authorization, tenant_header)
        self._room = asyncio.Semaphore(state.settings.api.max_bulk_jobs)
        self._max_frame = state.settings.api.max_body_bytes + FRAME_OVERHEAD
        self._answering: set[asyncio.Task[None]] = set()
        self._reading: asyncio.Task[None] | None = None
        self._close_code: int | None = None
        self._closed = asyncio.Event()

    async def run(self) -> None:
        OPEN.open.add(self)
        self._reading = asyncio.create_task(self._read())
        try:
            with contextlib.suppress(asyncio.CancelledError):
                await self._reading
            if self._answering:
                await asyncio.wait(set(self._answering))
            if self._close_code is not None:
                with contextlib.suppress(Exception):
                    await self._ws.close(self._close_code)
        finally:
            OPEN.open.discard(self)
            self._closed.set()
            self._reading.cancel()
            for task in self._answering:
                task.cancel()

    async def drain(self) -> None:
        """Read no more frames; ``run`` answers those read, then closes with 1001."""
        self._stop_reading(GOING_AWAY)
        await self._closed.wait()

    def _stop_reading(self, code: int) -> None:
        reading = self._reading
        if reading is not None and not reading.done():
            self._close_code = code
            reading.cancel()

    async def _read(self) -> None:
        """Frames until the caller closes (or ``_stop_reading`` cancels it)."""
        while True:
            await self._room.acquire()
            message = await self._ws.receive()
            if message["type"] == "websocket.disconnect":
                return
            data = message.get("text") or message.get("bytes") or ""
            task = asyncio.create_task(self._answer(data))
            self._answering.add(task)
            task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[None]) -> None:
        self._answering.discard(task)
        self._room.release()

    async def _answer(self, data: str | bytes) -> None:
        ref, job, parsed = _frame(data)
        state = self._state
        if not parsed:
            invalid = error_response(400, "invalid_json", "the frame is not valid JSON")
            await self._send(None, item_of(invalid))
            return
        try:
            if len(data) > self._max_frame:
                raise BodyTooLarge(state.settings.api.max_body_bytes)
            if job is None:
                raise InvalidRequest('a frame is {"ref": <int or string>, "job": {<a job>}}')
            caller = await current_caller(state.settings, state.keys, *self._credentials)
        except (SluicegateError, BodyTooLarge) as exc:
            if isinstance(exc, Unauthorized):
                self._stop_reading(POLICY)  # the key no longer holds: no more frames
            await self._send(ref, await _refusal(self._ws, exc))
            return
        try:
            answer = await answer_of(
                self._ws,
                job,
                caller.tenant,
                state.settings.api,
                state.pools,
                state.group_commit,
                datetime.now(UTC),
            )
        except Exception:  # what no handler answers: a 500, as the route's would be
            log.exception("submit channel: frame %r failed", ref)
            answer = item_of(error_response(500, "internal_error", "internal error"))
        await self._send(ref, answer)

    async def _send(self, ref: Any, answer: dict[str, Any]) -> None:
        with contextlib.suppress(WebSocketDisconnect, RuntimeError):  # the caller left
            await self._ws.send_text(json.dumps({"ref": ref, **answer}, separators=(",", ":")))


def _frame(data: str | bytes) -> tuple[Any, Any, bool]:
    """A frame's ref and job (None when it is not a frame), and whether it was JSON."""
    try:
        frame = json.loads(data)
    except ValueError:
        return None, None, False
    if type(frame) is not dict:
        return None, None, True
    ref = frame.get("ref")
    if type(ref) not in (int, str):
        return None, None, True
    return ref, frame.get("job"), True


async def _refusal(websocket: WebSocket, exc: Exception) -> dict[str, Any]:
    answer = await answer_for(websocket, exc)
    assert answer is not None
    return item_of(answer)
