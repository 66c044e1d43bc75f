"""Concurrent single submits, coalesced: ``submit()`` calls made while the client's requests
are being answered wait, and go together in the next request, to ``POST /v1/jobs/bulk``,
which answers for each job as ``POST /v1/jobs`` would have. A submit made with nothing
waiting goes at once, alone, to ``POST /v1/jobs``: a lone caller waits for nothing.

It is the API's group commit seen from the client: at most ``max_in_flight`` requests at
once, each carrying whatever was submitted meanwhile (at most ``max_jobs`` jobs and about
``max_bytes`` of JSON). Each caller keeps its own answer: its own status (202, 200, 409,
429…), body, idempotency key and admission decision. A server without the bulk route
(404/405), or one that refuses a bulk request as a whole (413: over its body limit), gets
that group's jobs one request each, and no more bulk requests (404/405).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class JobAnswer:
    """What the API answered for one job: status, JSON body, headers (lower-case names)."""

    status: int
    body: Any
    headers: Mapping[str, str] = field(default_factory=dict)


class BulkRefused(Exception):
    """The bulk request was not answered job by job: the server has no bulk route
    (``lasting``), or refused this request as a whole (over its body limit)."""

    def __init__(self, status: int, *, lasting: bool) -> None:
        super().__init__(f"POST /v1/jobs/bulk answered {status}")
        self.lasting = lasting


# Sends one job's body, as JSON (POST /v1/jobs), or many (POST /v1/jobs/bulk, one answer
# each, or BulkRefused).
SendOne = Callable[[bytes], Awaitable[JobAnswer]]
SendMany = Callable[[list[bytes]], Awaitable[list[JobAnswer]]]


def encoded(body: dict[str, Any]) -> bytes:
    """A job's body as the requests carry it: compact JSON, encoded once."""
    return json.dumps(body, separators=(",", ":")).encode()


@dataclass
class _Waiting:
    body: bytes  # the job's JSON, encoded once
    answer: asyncio.Future[JobAnswer]


class Coalescer:
    def __init__(
        self,
        one: SendOne,
        many: SendMany,
        *,
        max_in_flight: int = 4,
        max_jobs: int = 256,
        max_bytes: int = 512 * 1024,
    ) -> None:
        self._one = one
        self._many = many
        self._max_in_flight = max_in_flight
        self._max_jobs = max_jobs
        self._max_bytes = max_bytes
        self._waiting: list[_Waiting] = []
        self._in_flight = 0
        self._bulk = True  # until the server shows it has no bulk route
        self._senders: set[asyncio.Task[None]] = set()

    async def submit(self, body: dict[str, Any]) -> JobAnswer:
        """``body``'s answer, sent alone or with the submits made meanwhile."""
        answer: asyncio.Future[JobAnswer] = asyncio.get_running_loop().create_future()
        self._waiting.append(_Waiting(encoded(body), answer))
        if self._in_flight < self._max_in_flight:
            self._in_flight += 1
            sender = asyncio.create_task(self._send_while_waiting())
            self._senders.add(sender)
            sender.add_done_callback(self._senders.discard)
        return await answer

    async def _send_while_waiting(self) -> None:
        try:
            while group := self._take():
                await self._send(group)
        finally:
            self._in_flight -= 1

    def _take(self) -> list[_Waiting]:
        """The oldest submits waiting, as many as one request carries."""
        taken, size = 0, 0
        for waiting in self._waiting:
            if taken and (taken >= self._max_jobs or size + len(waiting.body) > self._max_bytes):
                break
            taken, size = taken + 1, size + len(waiting.body)
            if not self._bulk:
                break
        group, self._waiting = self._waiting[:taken], self._waiting[taken:]
        return group

    async def _send(self, group: list[_Waiting]) -> None:
        try:
            if len(group) == 1:
                await self._alone(group[0])
                return
            try:
                answers = await self._many([w.body for w in group])
            except BulkRefused as refused:
                self._bulk = self._bulk and not refused.lasting
                await asyncio.gather(*(self._alone(w) for w in group))
                return
            for waiting, answer in zip(group, answers, strict=True):
                _settle(waiting.answer, answer)
        except BaseException as exc:  # a transport error, a cancel: every caller sees it
            for waiting in group:
                _fail(waiting.answer, exc)
            if not isinstance(exc, Exception):
                raise

    async def _alone(self, waiting: _Waiting) -> None:
        try:
            _settle(waiting.answer, await self._one(waiting.body))
        except Exception as exc:
            _fail(waiting.answer, exc)


def _settle(future: asyncio.Future[JobAnswer], answer: JobAnswer) -> None:
    if not future.done():  # its caller may have been cancelled
        future.set_result(answer)


def _fail(future: asyncio.Future[JobAnswer], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
