"""Holding a request until its job is terminal (``?wait=``).

A waiting request is woken by the jobs channel's NOTIFY (the trigger sends one for every
terminal write), never by polling the table. While it waits, its caller is present: the job's
heartbeat lease is renewed. If the caller's connection closes first and the job asked for it
(``abandon_on_disconnect``), the job is abandoned; otherwise the wait just ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

from starlette.types import Receive

from plumbing.notify import JobNotice
from plumbing.retry import wait_first
from producers.jobs.repository import JobRepository
from schemas import reasons
from schemas.errors import InvalidRequest, JobNotFound
from schemas.jobs import Job

log = logging.getLogger(__name__)

DISCONNECTED = reasons.DISCONNECTED


class InvalidWait(InvalidRequest):
    """``?wait=`` is not within (0, ``max_wait_s``]."""

    code = "invalid_wait"


def wait_limit(wait_s: float | None, max_wait_s: float) -> float | None:
    """A ``?wait=`` within (0, max_wait_s] (None: no wait), or 422 ``invalid_wait``."""
    if wait_s is not None and not 0 < wait_s <= max_wait_s:
        raise InvalidWait(
            f"wait must be more than 0 and at most {max_wait_s:g} seconds",
            details=[{"loc": ["query", "wait"], "type": "out_of_range"}],
        )
    return wait_s


class WaitersFull(Exception):
    """As many requests wait as the registry holds; this one is answered at once."""


class Waiters:
    """Who waits on which job: one event per waiting request, at most ``limit`` of them."""

    def __init__(self, *, limit: int) -> None:
        self._limit = limit
        self._by_job: dict[str, set[asyncio.Event]] = {}
        self._count = 0

    def __len__(self) -> int:
        return self._count

    @contextlib.contextmanager
    def watch(self, job_id: str) -> Iterator[asyncio.Event]:
        """Register before reading the job's state, so that no wake-up falls in between.

        The event is set on every notice for the job (and on every reconnect of the
        listener); the holder clears it before each read.
        """
        if self._count >= self._limit:
            raise WaitersFull
        event = asyncio.Event()
        self._by_job.setdefault(job_id, set()).add(event)
        self._count += 1
        try:
            yield event
        finally:
            self._count -= 1
            group = self._by_job[job_id]
            group.discard(event)
            if not group:
                del self._by_job[job_id]

    def on_notice(self, payload: str) -> None:
        notice = JobNotice.parse(payload)
        if notice is None:
            log.warning("ignoring a malformed jobs notice: %r", payload)
            return
        for event in self._by_job.get(notice.job_id, ()):
            event.set()

    def on_connect(self) -> None:
        """Notices sent while the listener was down are lost: every waiter re-reads."""
        for group in self._by_job.values():
            for event in group:
                event.set()


class Reads:
    """Re-reads of woken waiters, coalesced: every request woken in the same turn of the
    event loop (one NOTIFY burst: a batch of jobs ending together) shares one query."""

    def __init__(self, repo: JobRepository) -> None:
        self._repo = repo
        self._pending: dict[tuple[str, str], list[asyncio.Future[Job]]] = {}
        self._flush: asyncio.Task[None] | None = None

    async def read(self, tenant: str, job_id: str) -> Job:
        future: asyncio.Future[Job] = asyncio.get_running_loop().create_future()
        self._pending.setdefault((tenant, job_id), []).append(future)
        if self._flush is None:
            self._flush = asyncio.create_task(self._read_pending(), name="waiters-read")
        return await future

    async def _read_pending(self) -> None:
        await asyncio.sleep(0)  # let every waiter woken in this turn join the query
        batch, self._pending, self._flush = self._pending, {}, None
        try:
            found = await self._repo.get_many(list(batch))
        except Exception as exc:
            for futures in batch.values():
                for future in futures:
                    if not future.done():
                        future.set_exception(exc)
            return
        for key, futures in batch.items():
            for future in futures:
                if future.done():
                    continue
                if key in found:
                    future.set_result(found[key])
                else:
                    future.set_exception(JobNotFound(f"no job {key[1]}"))


@dataclass(frozen=True, kw_only=True)
class Waited:
    job: Job  # as last read
    disconnected: bool = False


@dataclass(frozen=True, kw_only=True)
class Waiting:
    """What a ``?wait=`` needs: the jobs, the registry of waiting requests, the shared reads."""

    repo: JobRepository
    waiters: Waiters
    reads: Reads

    async def job(self, tenant: str, job_id: str, wait_s: float, receive: Receive) -> Job:
        """The job once it is terminal, or as it is when ``wait_s`` ran out or the caller
        left (``receive``: the request's, to see it leave)."""
        waited = await wait_for_terminal(
            self.repo,
            self.waiters,
            self.reads,
            tenant=tenant,
            job_id=job_id,
            wait_s=wait_s,
            receive=receive,
        )
        return waited.job


async def wait_for_terminal(
    repo: JobRepository,
    waiters: Waiters,
    reads: Reads,
    *,
    tenant: str,
    job_id: str,
    wait_s: float,
    receive: Receive | None,
) -> Waited:
    """The job once it is terminal, or as it is when ``wait_s`` ran out or the caller left.

    ``receive`` is the request's ASGI receive, after its body was read: it answers
    ``http.disconnect`` when the client goes away (None: do not watch).
    """
    deadline = asyncio.get_running_loop().time() + wait_s
    try:
        with waiters.watch(job_id) as woken:
            async with _disconnect(receive) as gone:
                return await _wait(repo, reads, tenant, job_id, deadline, woken, gone)
    except WaitersFull:
        log.warning("%d requests wait already: answering at once", len(waiters))
        return Waited(job=await repo.poll(tenant, job_id))


async def _wait(
    repo: JobRepository,
    reads: Reads,
    tenant: str,
    job_id: str,
    deadline: float,
    woken: asyncio.Event,
    gone: asyncio.Event,
) -> Waited:
    loop = asyncio.get_running_loop()
    renew = True
    while True:
        if renew:  # the caller is here: a poll renews its lease
            woken.clear()
            job = await repo.poll(tenant, job_id)
        else:  # woken by a notice: read with the others woken with it
            woken.clear()
            job = await reads.read(tenant, job_id)
        if job.state.terminal:
            return Waited(job=job)
        if gone.is_set():
            return await _left(repo, job)
        remaining = deadline - loop.time()
        if remaining <= 0:
            return Waited(job=job)
        if job.abandon_after_s is not None:
            remaining = min(remaining, job.abandon_after_s / 2)
        await wait_first(woken, gone, limit_s=remaining)
        if gone.is_set():
            return await _left(repo, job)
        renew = not woken.is_set()


async def _left(repo: JobRepository, job: Job) -> Waited:
    """The caller went away before the job ended."""
    if job.abandon_on_disconnect:
        # The caller's gone: finish the write even if this request is cancelled now.
        wrote = await asyncio.shield(repo.abandon(job.tenant, job.id, DISCONNECTED))
        log.info("job %s: caller disconnected, %s", job.id, "abandoned" if wrote else "ended")
    return Waited(job=job, disconnected=True)


@contextlib.asynccontextmanager
async def _disconnect(receive: Receive | None) -> AsyncIterator[asyncio.Event]:
    """An event set when the client closes its connection."""
    gone = asyncio.Event()
    if receive is None:
        yield gone
        return
    task = asyncio.create_task(_until_disconnect(receive, gone), name="wait-disconnect")
    try:
        yield gone
    finally:
        task.cancel()
        await asyncio.wait([task])
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.warning("watching for a disconnect failed: %r", exc)


async def _until_disconnect(receive: Receive, gone: asyncio.Event) -> None:
    # The body was read already; what is left is an empty http.request (a GET's first
    # receive) and then, whenever the client goes away, http.disconnect.
    ends = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            gone.set()
            return
        if not message.get("more_body", False):
            ends += 1
            if ends > 1:  # a server that answers at once, again and again: cannot watch
                log.warning("the server does not report disconnects; not watching")
                return
