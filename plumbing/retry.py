"""Transient database errors, retried with a bounded, jittered backoff and counted.

A deadlock (SQLSTATE 40P01), a serialization failure (40001) or a lost connection fails
one transaction, not the process: the transaction rolled back, so running it again is
safe. ``retrying`` runs an operation again up to ``attempts`` times, sleeping a random
("full jitter") share of an exponential step capped at ``max_wait_s`` between tries, and
counts each retry in ``sluicegate_database_retries_total{operation, error}``; the last
error is raised when the attempts run out, for the caller's loop to back off further.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

from aiokafka.errors import KafkaError
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
)

from plumbing.metrics import DATABASE_RETRIES

log = logging.getLogger(__name__)

T = TypeVar("T")

# The jitter's own generator: the process-wide ``random`` stays the caller's.
_JITTER = random.Random()

SQLSTATES = {"40P01": "deadlock", "40001": "serialization_failure"}


def transient_error(exc: BaseException) -> str | None:
    """What kind of transient database error ``exc`` is (``deadlock``,
    ``serialization_failure``, ``connection``), or None when it is not one."""
    if isinstance(exc, DBAPIError):
        code = getattr(exc.orig, "sqlstate", None)
        if code in SQLSTATES:
            return SQLSTATES[code]
        if exc.connection_invalidated or isinstance(exc, OperationalError | InterfaceError):
            return "connection"
        return None
    if isinstance(exc, PoolTimeout | OSError):
        return "connection"
    return None


def count(operation: str, exc: BaseException) -> str | None:
    """Count a retry of ``operation`` after ``exc`` if it is transient; its kind."""
    kind = transient_error(exc)
    if kind is not None:
        DATABASE_RETRIES.labels(operation=operation, error=kind).inc()
    return kind


def retriable_broker_error(exc: BaseException) -> str | None:
    """The name of a Kafka error the broker says to retry (a coordinator still loading or
    moving, a leader not elected yet), or None."""
    return type(exc).__name__ if isinstance(exc, KafkaError) and exc.retriable else None


async def retrying(
    operation: str,
    op: Callable[[], Awaitable[T]],
    *,
    attempts: int = 5,
    first_wait_s: float = 0.02,
    max_wait_s: float = 1.0,
    transient: Callable[[BaseException], str | None] = transient_error,
) -> T:
    """``op()``, run again after a transient error, at most ``attempts`` times. Transient
    are the database errors of ``transient_error`` (counted), or what ``transient`` says."""

    def before_sleep(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        if exc is not None:
            kind = count(operation, exc) if transient is transient_error else transient(exc)
            log.warning("%s: %s, retrying (attempt %d)", operation, kind, state.attempt_number)

    def wait(state: RetryCallState) -> float:
        """Full jitter: a random share of an exponential step, capped."""
        return _JITTER.uniform(0, min(first_wait_s * 2 ** (state.attempt_number - 1), max_wait_s))

    async for attempt in AsyncRetrying(
        stop=stop_after_attempt(attempts),
        wait=wait,
        retry=retry_if_exception(lambda exc: transient(exc) is not None),
        before_sleep=before_sleep,
        reraise=True,
    ):
        with attempt:
            return await op()
    raise AssertionError("unreachable: tenacity reraises the last error")
