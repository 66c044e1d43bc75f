"""Group commit of single submits: concurrent POST /v1/jobs share one statement.

Each submit stores its job and its dispatch record, durably, before it is answered. Alone,
that is a transaction and a WAL flush per submit; here the submits that arrive together are
written by one statement (``JobRepository.submit_group``: one round trip, one transaction,
one flush), and each waits for the commit of its own group before its 2xx.

When a group is written:
- at once when no other group is being written (an idle API adds no wait to a submit);
- else when it holds ``max_items`` submits, or ``wait_s`` after its first one arrived, if
  one of the ``writers`` is free. While every writer is busy, arrivals gather (bounded by
  the requests the API holds open, ``api_max_connections``) and the next free writer takes
  up to ``max_items`` of them.

Each submit gets its own answer: a created job (202), an idempotent replay (200), or the
error that is its own (409 for a reused key). A statement that fails stores nothing; unless
the database is out of reach (every submit of the group gets that error, 503), the group is
split in halves and each half written again, down to the one submit at fault. A submit whose
caller goes away before its group is taken is dropped; once taken, it is written. On stop,
the submits still gathered are written before ``run`` returns.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from plumbing.retry import forward, wait_first
from plumbing.settings.api import ApiSettings
from producers.jobs.submit_repository import Stored
from producers.metrics import SUBMIT_GROUP
from schemas.errors import SluicegateError
from schemas.jobs import NewJob


class GroupWriter(Protocol):
    """What writes a group (``JobRepository``): an answer per job, in order."""

    async def submit_group(self, group: Sequence[NewJob]) -> list[Stored | SluicegateError]: ...


@dataclass(eq=False)
class _Submit:
    new: NewJob
    arrived: float
    answer: asyncio.Future[Stored | BaseException]


def out_of_reach(exc: BaseException) -> bool:
    """The database could not be reached (or the connection broke): a failure of every
    submit of the group alike, and one that a smaller group would meet again. A broken
    connection may also leave a commit's outcome unknown, so nothing is written again."""
    if isinstance(exc, DBAPIError):
        return isinstance(exc, OperationalError | InterfaceError) or exc.connection_invalidated
    return isinstance(exc, PoolTimeout | OSError | TimeoutError)


class GroupCommit:
    def __init__(self, writer: GroupWriter, *, max_items: int, wait_s: float, writers: int) -> None:
        self._writer = writer
        self._max = max_items
        self._wait_s = wait_s
        self._writers = writers
        self._gathered: deque[_Submit] = deque()
        self._writing: set[asyncio.Task[None]] = set()
        self._changed = asyncio.Event()  # a submit arrived, or a write ended
        self._closed = False

    @classmethod
    def of(cls, writer: GroupWriter, api: ApiSettings) -> GroupCommit:
        return cls(
            writer,
            max_items=api.submit_batch_max,
            wait_s=api.submit_batch_wait_ms / 1000,
            writers=api.submit_batch_writers,
        )

    @property
    def gathered(self) -> int:
        return len(self._gathered)

    async def submit(self, new: NewJob) -> Stored:
        """Store the job with its group: (job, created) once the group is committed, or
        the error that is the job's own, raised."""
        loop = asyncio.get_running_loop()
        item = _Submit(new, loop.time(), loop.create_future())
        if self._closed:  # stopped: written alone, at once
            await self._write([item])
        else:
            self._gathered.append(item)
            self._changed.set()
        try:
            answer = await item.answer
        except asyncio.CancelledError:
            if item in self._gathered:  # not taken yet: it will not be stored
                self._gathered.remove(item)
            raise
        if isinstance(answer, BaseException):
            raise answer
        return answer

    async def run(self, stop: asyncio.Event) -> None:
        """Take groups and start their writes until ``stop``; then write what is gathered
        and wait for every write to end."""
        loop = asyncio.get_running_loop()
        stopping = forward(stop, self._changed)
        try:
            while True:
                self._changed.clear()
                if self._gathered and len(self._writing) < self._writers:
                    linger = 0.0 if stop.is_set() else self._linger_s(loop.time())
                    if linger <= 0:
                        self._start(self._take())
                    else:
                        await wait_first(self._changed, limit_s=linger)
                elif not stop.is_set() or self._gathered or self._writing:
                    await self._changed.wait()  # a submit arrives, a write ends, or stop
                else:
                    self._closed = True
                    return
        finally:
            stopping.cancel()

    def _linger_s(self, now: float) -> float:
        """How much longer the next group may wait for more submits."""
        if not self._writing or len(self._gathered) >= self._max:
            return 0.0
        return self._gathered[0].arrived + self._wait_s - now

    def _take(self) -> list[_Submit]:
        return [self._gathered.popleft() for _ in range(min(self._max, len(self._gathered)))]

    def _start(self, group: list[_Submit]) -> None:
        task = asyncio.create_task(self._write(group), name="submit-group")
        self._writing.add(task)
        task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[None]) -> None:
        self._writing.discard(task)
        self._changed.set()

    async def _write(self, group: list[_Submit]) -> None:
        """Write the group and answer each of its submits; never raises."""
        SUBMIT_GROUP.observe(len(group))
        try:
            answers = await self._writer.submit_group([s.new for s in group])
        except Exception as exc:
            if len(group) == 1 or out_of_reach(exc):
                for s in group:
                    _answer(s, exc)
                return
            half = len(group) // 2
            await self._write(group[:half])
            await self._write(group[half:])
            return
        except BaseException as exc:  # cancelled: the callers must not wait forever
            for s in group:
                _answer(s, exc)
            raise
        for s, answer in zip(group, answers, strict=True):
            _answer(s, answer)


def _answer(item: _Submit, answer: Stored | BaseException) -> None:
    if not item.answer.done():  # done: its caller was cancelled
        item.answer.set_result(answer)
