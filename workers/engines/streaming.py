"""What the HTTP engines share: one request in flight as a reader task and the items it read.

The reader task owns the HTTP response; ``generate`` takes items from its queue, the last
of a whole output being the server's ``finish_reason`` (a ``Finished``). Aborting a
request from elsewhere (``engine.abort(id)``) cancels the reader, which closes the connection:
vLLM and llama.cpp both abort a request whose client went away and free its KV. The queue
holds at most one item per generated token, so ``max_tokens`` bounds it.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Coroutine
from typing import Any

import httpx

from schemas.jobs import finish_reason_of
from workers.engines.base import Finished
from workers.engines.errors import (
    DuplicateRequest,
    EngineAborted,
    EngineError,
    EngineUnavailable,
)

log = logging.getLogger(__name__)

Reader = Callable[[asyncio.Queue["Item"]], Coroutine[Any, Any, None]]


class End:
    """Marks the end of a stream's items that did not end on the server's own: stopped."""


END = End()
Item = str | Finished | End | EngineError


class Stream:
    """One request in flight: the task reading its response, and what it read."""

    def __init__(self) -> None:
        self.items: asyncio.Queue[Item] = asyncio.Queue()
        self.reader: asyncio.Task[None] | None = None
        self.stopped = False

    async def stop(self) -> None:
        """Drop what was read but not taken and close the connection."""
        self.stopped = True
        self.items.put_nowait(END)
        if self.reader is not None:
            self.reader.cancel()
            await asyncio.wait([self.reader])


class InFlight:
    """An HTTP engine's requests in flight, by request id."""

    def __init__(self) -> None:
        self._streams: dict[str, Stream] = {}

    async def items(self, request_id: str, reader: Reader) -> AsyncGenerator[str | Finished, None]:
        """Run ``reader`` as the request's reader task and yield what it reads, until its
        end (a ``Finished``, yielded last), its error (raised), or an abort. Closing this
        stream aborts the request."""
        if request_id in self._streams:
            raise DuplicateRequest(f"request {request_id!r} is already running")
        stream = Stream()
        self._streams[request_id] = stream
        stream.reader = asyncio.create_task(reader(stream.items), name=f"engine-{request_id}")
        try:
            while True:
                item = await stream.items.get()
                if stream.stopped or isinstance(item, End):
                    return
                if isinstance(item, EngineError):
                    raise item
                yield item
                if isinstance(item, Finished):
                    return
        finally:
            if self._streams.get(request_id) is stream:
                del self._streams[request_id]
            await stream.stop()

    async def abort(self, request_id: str) -> None:
        stream = self._streams.pop(request_id, None)
        if stream is not None:
            await stream.stop()

    async def abort_all(self) -> None:
        for request_id in list(self._streams):
            await self.abort(request_id)


async def sse_events(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    """The JSON events of a server-sent event stream, up to ``data: [DONE]``."""
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue
        data = line.removeprefix("data:").strip()
        if data == "[DONE]":
            return
        event: dict[str, Any] = json.loads(data)
        yield event


def end_of_output(
    finish: str | None, yielded: int, usage: int | None, items: asyncio.Queue[Item]
) -> Item:
    """What ends a stream whose last ``finish_reason`` was ``finish``: the server's reason
    (``Finished``), once the items are made up to its ``usage`` count; or why it is not a
    whole output. Only "stop" and "length" are; "abort" means the server ended it itself
    (vLLM: ``/pause``, ``/sleep``, ``/abort_requests``), a retriable error."""
    if finish is None:
        return EngineUnavailable("the stream ended before its output did")
    if finish == "abort":
        return EngineAborted("the server aborted the request before its output ended")
    if (reason := finish_reason_of(finish)) is not None:
        if usage is not None and yielded > usage:
            log.warning("%d items for the %d tokens the server counted", yielded, usage)
        for empty in padding(yielded, usage):
            items.put_nowait(empty)
        return Finished(reason)
    return EngineError(f"the server ended the output with finish_reason {finish!r}")


def padding(yielded: int, server_count: int | None) -> list[str]:
    """Empty items that bring a stream's count up to the server's own count of generated
    tokens (text that came merged in one chunk, or tokens without text such as EOS)."""
    if server_count is None or server_count <= yielded:
        return []
    return [""] * (server_count - yielded)


def output_pieces(text: str, num_tokens: int) -> list[str]:
    """One item per generated token from a delta of ``num_tokens`` tokens and ``text``: the
    text first, then empty strings (detokenized text cannot be split back into tokens)."""
    if num_tokens <= 0:
        return [text] if text else []
    return [text] + [""] * (num_tokens - 1)
