"""Single submits over one WebSocket (the API's ``/v1/jobs/channel``): a caller submitting
one job after another pays HTTP's request path (its client's and the server's) once, not a
submit. Each job is its own frame and gets its own answer, the one ``POST /v1/jobs`` gives,
once the job is durable.

``submit`` opens the channel when it is not open. A server without the channel (an older
API, a proxy that does not pass WebSockets: 400, 404, 405, 426) is remembered, and
``refused`` tells the client to use HTTP from then on. A handshake the API refuses with an
answer of its own (401 for a bad key, 503) is that answer.

When the server closes the channel with 1001 (it is stopping) or 1008 (the key was
revoked), it answered every frame it read: a submit left unanswered raises ``NotRead`` and
may be sent again. A connection broken otherwise leaves the submits in flight unanswered
(``Unreachable``), as a broken HTTP connection leaves its request.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Mapping
from typing import Any

import httpx
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from client.coalesce import JobAnswer
from client.errors import Unreachable

PATH = "/v1/jobs/channel"
MAX_BODY = 1 << 20  # bigger jobs go by POST, whose 413 is the server's to give
ANSWERED_ALL = frozenset({1001, 1008})  # closes after which every frame read was answered
NO_CHANNEL = frozenset({400, 404, 405, 426})


class NotRead(Exception):
    """The server closed the channel without reading this submit: nothing was stored."""


class _Open:
    """One connection: its submits waiting for their answers, and the task reading them."""

    def __init__(self, ws: ClientConnection, base_url: str) -> None:
        self.ws = ws
        self.base_url = base_url
        self.waiting: dict[int, asyncio.Future[JobAnswer]] = {}
        self.reader = asyncio.create_task(self._read(), name="sluicegate-channel")

    async def _read(self) -> None:
        try:
            async for message in self.ws:
                try:
                    frame = json.loads(message)
                    ref, answer = frame.get("ref"), _answer(frame)
                except (ValueError, KeyError, TypeError, AttributeError):
                    continue  # not an answer of the API's: no submit is waiting for it
                future = self.waiting.pop(ref, None)
                if future is not None and not future.done():
                    future.set_result(answer)
        except ConnectionClosed:
            pass
        finally:
            code = self.ws.close_code
            for future in self.waiting.values():
                if not future.done():
                    future.set_exception(NotRead() if code in ANSWERED_ALL else self._broken(code))
            self.waiting.clear()

    def _broken(self, code: int | None) -> Unreachable:
        why = "the connection broke" if code is None else f"the channel closed with {code}"
        return Unreachable(self.base_url, ConnectionError(why))


class SubmitChannel:
    def __init__(self, base_url: str, headers: Mapping[str, str], timeout_s: float) -> None:
        url = httpx.URL(base_url)
        scheme = "wss" if url.scheme == "https" else "ws"
        self._url = str(url.copy_with(scheme=scheme, path=url.path.rstrip("/") + PATH))
        self._base_url = base_url
        self._headers = dict(headers)
        self._timeout_s = timeout_s
        self._open: _Open | None = None
        self._opening: asyncio.Lock | None = None
        self._refs = itertools.count()
        self.refused = False  # the server has no channel: the client uses HTTP

    async def submit(self, body: bytes) -> JobAnswer:
        """The job's answer (``body``: its JSON): from the server, or the answer that
        refused the handshake. ``NotRead``: send it again; ``Unreachable``: not known."""
        opened = self._open
        if opened is None or opened.reader.done():
            found = await self._connect()
            if isinstance(found, JobAnswer):
                return found
            opened = found
        ref = next(self._refs)
        answer = asyncio.get_running_loop().create_future()
        opened.waiting[ref] = answer
        try:
            try:
                await opened.ws.send(b'{"ref":%d,"job":%b}' % (ref, body), text=True)
            except ConnectionClosed:
                await asyncio.wait({opened.reader})  # it says why, to every submit waiting
            async with asyncio.timeout(self._timeout_s):
                said: JobAnswer = await answer
                return said
        except TimeoutError:
            raise Unreachable(self._base_url, httpx.ReadTimeout("no answer in time")) from None
        finally:
            opened.waiting.pop(ref, None)

    async def _connect(self) -> _Open | JobAnswer:
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:
            opened = self._open
            if opened is not None and not opened.reader.done():
                return opened
            try:
                ws = await connect(
                    self._url,
                    additional_headers=self._headers,
                    open_timeout=self._timeout_s,
                    compression=None,
                    proxy=None,
                )
            except InvalidStatus as refused:
                return self._refusal(refused)
            except (OSError, TimeoutError) as exc:
                raise Unreachable(self._base_url, exc) from None
            self._open = _Open(ws, self._base_url)
            return self._open

    def _refusal(self, refused: InvalidStatus) -> JobAnswer:
        response = refused.response
        if response.status_code in NO_CHANNEL:
            self.refused = True
            raise NotRead  # not sent at all: by HTTP
        try:
            body = json.loads(response.body or b"")
        except ValueError:
            body = (response.body or b"").decode("utf-8", "replace")
        headers = {k.lower(): v for k, v in response.headers.raw_items()}
        return JobAnswer(response.status_code, body, headers)

    async def close(self) -> None:
        opened, self._open = self._open, None
        if opened is not None:
            await opened.ws.close()
            await asyncio.wait({opened.reader})


def _answer(frame: dict[str, Any]) -> JobAnswer:
    return JobAnswer(int(frame["status"]), frame["body"], frame.get("headers") or {})
