"""The unit of work's own rules, without a database: what waits, what runs alone, what
joins, and what a failed transaction gives back."""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from typing import Any

import pytest

from plumbing.published_store import Acked, OutboxRow, Published
from plumbing.unit_of_work import MAX_JOINED_S, Unit, UnitOfWork


class _Connection:
    def __init__(self, name: str) -> None:
        self.name = name

    def __str__(self) -> str:
        return self.name


class _Engine:
    """Connections that are only names: a write alone runs on "alone"."""

    def execution_options(self, **_: Any) -> _Engine:
        return self

    @asynccontextmanager
    async def connect(self) -> Any:
        yield _Connection("alone")


def _work(linger_s: float) -> UnitOfWork:
    return UnitOfWork(_Engine(), linger_s=linger_s)  # type: ignore[arg-type]


def _record(n: int) -> Published:
    row = OutboxRow(id=n, topic="events", key=str(n), payload=b"")
    return Published(row=row, acked=Acked(topic="events", partition=0, offset=n))


async def _carry(unit: Unit, fail: bool = False) -> None:
    async with unit.settling():
        await unit.run(_Connection("the carrier"))  # type: ignore[arg-type]
        if fail:
            raise RuntimeError("the carrier's statement failed")


async def test_a_write_that_was_slow_in_a_carrier_runs_alone_for_a_while() -> None:
    work = _work(30.0)

    async def slow(unit: Unit) -> str:
        await asyncio.sleep(MAX_JOINED_S * 5)
        return f"ran on {unit.connection}"

    first = asyncio.create_task(work.join(slow))
    await asyncio.sleep(0)
    await _carry(work.take())
    assert await first == "ran on the carrier"
    # Its next run does not wait for a carrier: it holds none up.
    task = asyncio.create_task(work.join(slow))
    await asyncio.sleep(0)
    assert work.waiting == 0
    assert await task == "ran on alone"


async def test_a_cheap_write_waits_and_joins() -> None:
    work = _work(30.0)

    async def write(unit: Unit) -> str:
        return f"ran on {unit.connection}"

    task = asyncio.create_task(work.join(write))
    await asyncio.sleep(0)
    assert work.waiting == 1
    await _carry(work.take())
    assert await task == "ran on the carrier"


async def test_a_write_no_transaction_took_runs_alone_after_its_linger() -> None:
    work = _work(0.05)

    async def write(unit: Unit) -> str:
        return f"ran on {unit.connection}"

    assert await asyncio.wait_for(work.join(write), 5) == "ran on alone"
    assert work.waiting == 0


async def test_a_failed_carrier_undoes_each_write_and_gives_the_records_back() -> None:
    work = _work(30.0)
    work.add_published([_record(1), _record(2)])
    undone: list[str] = []
    ran: list[str] = []

    async def write(unit: Unit) -> str:
        ran.append(str(unit.connection))
        return "written"

    task = asyncio.create_task(work.join(write, undo=lambda: undone.append("undone")))
    await asyncio.sleep(0)
    unit = work.take()

    async def carried() -> None:
        async with unit.settling():
            await unit.run(_Connection("the carrier"))  # type: ignore[arg-type]
            assert [r.row.id for r in unit.take_published()] == [1, 2]
            assert work.published_waiting == 0
            work.add_published([_record(3)])  # published meanwhile
            raise RuntimeError("the carrier's statement failed")

    with pytest.raises(RuntimeError):
        await carried()
    assert await task == "written"
    assert ran == ["the carrier", "alone"]
    assert undone == ["undone"]
    # Given back first, in their order, before what came meanwhile.
    assert [r.row.id for r in work.published_taken()] == [1, 2, 3]


async def test_a_write_whose_caller_gave_up_leaves_the_unit() -> None:
    work = _work(30.0)

    async def write(unit: Unit) -> str:
        raise AssertionError("a cancelled write ran")

    task = asyncio.create_task(work.join(write))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert work.waiting == 0
    await _carry(work.take())
