"""Transient database errors are retried a bounded number of times and counted."""

from __future__ import annotations

import pytest
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError

from plumbing.metrics import RETRIES, registry
from plumbing.retry import retrying, transient_error


class Orig(Exception):
    def __init__(self, sqlstate: str | None) -> None:
        super().__init__(sqlstate)
        self.sqlstate = sqlstate


def error(sqlstate: str | None, kind: type[DBAPIError] = DBAPIError) -> DBAPIError:
    return kind("UPDATE jobs ...", {}, Orig(sqlstate))


def retries(operation: str, kind: str) -> float:
    return (
        registry("worker").get_sample_value(
            "sluicegate_retries_total", {"operation": operation, "error": kind}
        )
        or 0.0
    )


def test_what_is_transient() -> None:
    assert transient_error(error("40P01")) == "deadlock"
    assert transient_error(error("40001")) == "serialization_failure"
    assert transient_error(error(None, OperationalError)) == "connection"
    # A server restarting: "the database system is starting up", then shutting down, and a
    # connection exception (class 08)
    assert transient_error(error("57P03")) == "connection"
    assert transient_error(error("57P01")) == "connection"
    assert transient_error(error("08006")) == "connection"
    assert transient_error(ConnectionResetError()) == "connection"
    assert transient_error(error("23505", IntegrityError)) is None  # a unique violation
    assert transient_error(error("22P05")) is None  # a NUL character: the caller's fault
    assert transient_error(ValueError("x")) is None


async def test_a_deadlock_is_run_again_and_counted() -> None:
    before = retries("test_claim", "deadlock")
    failures = [error("40P01"), error("40P01")]

    async def op() -> str:
        if failures:
            raise failures.pop()
        return "claimed"

    assert await retrying("test_claim", op, attempts=5, first_wait_s=0.001) == "claimed"
    assert retries("test_claim", "deadlock") - before == 2
    assert RETRIES in registry("api")._collector_to_names  # every role counts them


async def test_the_retries_are_bounded() -> None:
    calls = 0

    async def op() -> None:
        nonlocal calls
        calls += 1
        raise error("40001")

    with pytest.raises(DBAPIError):
        await retrying("test_bounded", op, attempts=3, first_wait_s=0.001)
    assert calls == 3


async def test_any_other_error_is_raised_at_once() -> None:
    calls = 0

    async def op() -> None:
        nonlocal calls
        calls += 1
        raise error("23505", IntegrityError)

    with pytest.raises(IntegrityError):
        await retrying("test_other", op, attempts=5, first_wait_s=0.001)
    assert calls == 1
