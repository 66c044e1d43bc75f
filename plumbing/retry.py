"""The one way anything retries: an operation run again after an error the caller's
classifier calls transient, with a full-jitter exponential backoff, each retry logged and
counted in ``sluicegate_retries_total{operation, error}`` (tenacity underneath).

Two shapes of the same helper, ``retrying``:

- **bounded** (``attempts=N``): inside a request, where a caller waits (``IN_REQUEST``: a
  cancel gets 5 tries, then ``503 database_busy``); the last error is raised;
- **until it succeeds or ``stop`` is set** (``attempts=None``, the default): the loops that
  must outlive an outage (the relay's round, the webhook dispatcher's claims and enqueues,
  the LISTEN connection, a worker's consumer start and its result writes). ``Stopped`` is
  raised when ``stop`` is set while it waits.

The waits are a random share ("full jitter") of ``first_wait_s`` doubled at each try, capped
at ``max_wait_s``: ``FIRST_BACKOFF_S`` and ``MAX_BACKOFF_S`` for the loops, defined here
only. The jitter has a generator of its own, so the process-wide ``random`` stays the
caller's.

What is transient is the classifier's call: ``transient_error`` (a deadlock, a serialization
failure, a lost connection: the transaction rolled back, so running it again is safe),
``retriable_broker_error`` (Kafka says to retry), or ``outage`` (the database or the broker
unreachable or failing, for the loops that retried any such error before).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from aiokafka.errors import KafkaError
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    stop_never,
)

from plumbing.activity import QUIET_S, Activity
from plumbing.metrics import RETRIES

log = logging.getLogger(__name__)

T = TypeVar("T")

FIRST_BACKOFF_S = 0.1
MAX_BACKOFF_S = 5.0
# Inside a request a caller waits: few tries, short waits.
IN_REQUEST: dict[str, Any] = {"attempts": 5, "first_wait_s": 0.02, "max_wait_s": 1.0}

_JITTER = random.Random()

SQLSTATES = {"40P01": "deadlock", "40001": "serialization_failure"}
# The server going away, or not taking connections yet: a restart, a failover, a full house.
CONNECTION_SQLSTATES = {"57P01", "57P02", "57P03", "53300"}  # shutdown, crash, starting up, full

Classifier = Callable[[BaseException], str | None]


class Backoff:
    """When to try again something that failed and has no caller waiting to retry it (a
    worker's offset commit): after ``first_s``, then twice as long each failure up to
    ``max_s``; ``due()`` says whether now is the time, ``failed()``/``done()`` move it."""

    def __init__(self, first_s: float = 0.5, max_s: float = 8.0) -> None:
        self._first_s, self._max_s = first_s, max_s
        self._wait_s = first_s
        self._at: float | None = None

    def failed(self) -> float:
        """The next try's wait, in seconds."""
        wait_s = self._wait_s
        self._at = time.monotonic() + wait_s
        self._wait_s = min(wait_s * 2, self._max_s)
        return wait_s

    def done(self) -> None:
        self._at, self._wait_s = None, self._first_s

    def due(self) -> bool:
        return self._at is not None and time.monotonic() >= self._at


class Stopped(Exception):
    """The stop event was set while the operation waited to be tried again."""


def transient_error(exc: BaseException) -> str | None:
    """What kind of transient database error ``exc`` is (``deadlock``,
    ``serialization_failure``, ``connection``), or None when it is not one."""
    if isinstance(exc, DBAPIError):
        code = getattr(exc.orig, "sqlstate", None)
        if code in SQLSTATES:
            return SQLSTATES[code]
        if code in CONNECTION_SQLSTATES or (isinstance(code, str) and code.startswith("08")):
            return "connection"  # class 08: connection exception
        if exc.connection_invalidated or isinstance(exc, OperationalError | InterfaceError):
            return "connection"
        return None
    if isinstance(exc, PoolTimeout | OSError):
        return "connection"
    return None


def retriable_broker_error(exc: BaseException) -> str | None:
    """The name of a Kafka error the broker says to retry (a coordinator still loading or
    moving, a leader not elected yet), or None."""
    return type(exc).__name__ if isinstance(exc, KafkaError) and exc.retriable else None


def outage(exc: BaseException) -> str | None:
    """A service down or failing: a transient database error, any other database error
    (``database``), any Kafka error (``broker``) or a timeout (``timeout``); None else."""
    if (kind := transient_error(exc)) is not None:
        return kind
    if isinstance(exc, DBAPIError):
        return "database"
    if isinstance(exc, KafkaError):
        return "broker"
    if isinstance(exc, TimeoutError):
        return "timeout"
    return None


def count(
    operation: str, exc: BaseException, transient: Classifier = transient_error
) -> str | None:
    """Count a retry of ``operation`` after ``exc`` if ``transient`` calls it so; its kind.
    For the loops that try again at their next round instead of backing off."""
    kind = transient(exc)
    if kind is not None:
        RETRIES.labels(operation=operation, error=kind).inc()
    return kind


async def retrying(
    operation: str,
    op: Callable[[], Awaitable[T]],
    *,
    attempts: int | None = None,
    stop: asyncio.Event | None = None,
    transient: Classifier = transient_error,
    first_wait_s: float = FIRST_BACKOFF_S,
    max_wait_s: float = MAX_BACKOFF_S,
) -> T:
    """``op()``, run again after an error ``transient`` names, up to ``attempts`` times
    (None: until it succeeds or ``stop`` is set, then ``Stopped``). Any other error, and
    the last one when the attempts run out, is raised."""

    def wait(state: RetryCallState) -> float:
        return _JITTER.uniform(0, min(first_wait_s * 2 ** (state.attempt_number - 1), max_wait_s))

    def before_sleep(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        if exc is None:
            return
        kind = transient(exc)
        RETRIES.labels(operation=operation, error=kind).inc()
        seconds = state.next_action.sleep if state.next_action is not None else 0.0
        log.warning(
            "%s: %s, retrying in %.2fs (attempt %d): %r",
            operation,
            kind,
            seconds,
            state.attempt_number,
            exc,
        )

    async def sleep(seconds: float) -> None:
        if stop is None:
            await asyncio.sleep(seconds)
            return
        await wait_first(stop, limit_s=seconds)
        if stop.is_set():
            raise Stopped(operation)

    async for attempt in AsyncRetrying(
        stop=stop_after_attempt(attempts) if attempts is not None else stop_never,
        wait=wait,
        sleep=sleep,
        retry=retry_if_exception(lambda exc: transient(exc) is not None),
        before_sleep=before_sleep,
        reraise=True,
    ):
        with attempt:
            return await op()
    raise AssertionError("unreachable: tenacity reraises the last error")


async def in_rounds(
    operation: str,
    step: Callable[[], Awaitable[T]],
    stop: asyncio.Event,
    wake: asyncio.Event,
    *,
    interval_s: float,
    min_gap_s: float,
    logger: logging.Logger,
    name: str,
    quiet: Callable[[T], bool] | None = None,
    activity: Activity | None = None,
) -> None:
    """Run ``step`` at each ``wake`` and every ``interval_s``, rounds at least ``min_gap_s``
    apart, until ``stop``. A round failed by an outage (``outage``: the database, its
    connection pool or the network) is logged (as ``name``), counted as a retry of
    ``operation``, and tried again at the next round.

    With ``activity``, a round whose result is ``quiet`` (it found nothing to do) is
    followed by a wait of up to ``QUIET_S`` instead, ended at once by ``wake``, or by
    anything the activity's listener hears (only while it listens) and then an interval."""
    while not stop.is_set():
        wake.clear()
        heard = activity.changed() if activity is not None else None
        idle = False
        try:
            idle = quiet is not None and quiet(await step())
        except Exception as exc:
            if count(operation, exc, outage) is None:
                raise
            logger.warning("%s: round failed, retrying: %r", name, exc)
        await wait_first(stop, limit_s=min_gap_s)
        if idle and heard is not None and activity is not None and activity.listening:
            await wait_first(stop, wake, heard, limit_s=QUIET_S)
            if heard.is_set() and not wake.is_set():
                # Back to the cadence: the round comes within an interval of what was heard,
                # as it would have, not in step with the writes heard (a count begun just
                # after one would often see the next one's commit twice).
                await wait_first(stop, wake, limit_s=interval_s)
        else:
            await wait_first(stop, wake, limit_s=interval_s)


async def wait_first(*events: asyncio.Event, limit_s: float | None = None) -> None:
    """Return when any of the events is set, or after ``limit_s`` seconds (how every loop
    here waits between its rounds). One event is waited for without a task of its own (a
    busy loop's wait: ``forward`` makes its stop one of its events)."""
    if any(event.is_set() for event in events):
        await asyncio.sleep(0)  # a wait still lets the loop run others, as asyncio.wait does
        return
    if len(events) == 1:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(limit_s):
                await events[0].wait()
        return
    waiters = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waiters, timeout=limit_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()


def forward(
    source: asyncio.Event, target: asyncio.Event, *, again: bool = False
) -> asyncio.Task[None]:
    """A task that sets ``target`` once ``source`` is set (``again``: each time, clearing
    ``source``), so that a loop waits on ``target`` alone; cancel it when the loop ends."""

    async def forwarding() -> None:
        while True:
            await source.wait()
            target.set()
            if not again:
                return
            source.clear()

    return asyncio.create_task(forwarding(), name="forward")
