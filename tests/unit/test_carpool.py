"""The carpool's own rules, without a database: what waits, what runs alone, what rides."""

from __future__ import annotations

import asyncio
from typing import Any

from plumbing.carpool import MAX_RIDE_S, Carpool


async def test_a_write_that_was_slow_in_a_carrier_runs_alone_for_a_while() -> None:
    carpool = Carpool(30.0)
    gate = asyncio.Event()

    async def slow(conn: Any) -> str:
        await asyncio.sleep(MAX_RIDE_S * 5)
        return "rode"

    async def held_alone() -> str:
        await gate.wait()
        return "alone"

    first = asyncio.create_task(carpool.ride(slow, held_alone))
    await asyncio.sleep(0)
    boarded = carpool.board()
    async with boarded.settling():
        await boarded.run("the carrier")  # type: ignore[arg-type]
    assert await first == "rode"
    # Its next run does not wait for a carrier: it holds none up.
    task = asyncio.create_task(carpool.ride(slow, held_alone))
    await asyncio.sleep(0)
    assert carpool.waiting == 0
    gate.set()
    assert await task == "alone"


async def test_a_cheap_write_waits_and_rides() -> None:
    carpool = Carpool(30.0)

    async def write(conn: Any) -> str:
        return f"rode on {conn}"

    async def alone() -> str:
        raise AssertionError("ran alone")

    task = asyncio.create_task(carpool.ride(write, alone))
    await asyncio.sleep(0)
    assert carpool.waiting == 1
    boarded = carpool.board()
    async with boarded.settling():
        await boarded.run("the carrier")  # type: ignore[arg-type]
    assert await task == "rode on the carrier"
