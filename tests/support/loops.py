"""Running a process's loops in a test, and waiting for what they must do within a bound."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any

Loop = Callable[[asyncio.Event], Coroutine[Any, Any, None]]


@asynccontextmanager
async def running(*loops: Loop) -> AsyncIterator[None]:
    """The loops running (each ``loop(stop)``) until the block ends; a loop that died is
    raised at the end, so a loop that failed is never mistaken for one that was slow."""
    stop = asyncio.Event()
    tasks = [asyncio.create_task(loop(stop)) for loop in loops]
    try:
        yield
    finally:
        stop.set()
        ended = await asyncio.gather(*tasks, return_exceptions=True)
        for outcome in ended:
            if isinstance(outcome, BaseException):
                raise outcome


async def within(
    check: Callable[[], Awaitable[bool]], bound_s: float, what: str, since: float | None = None
) -> float:
    """Until ``check()`` holds, at most ``bound_s`` after ``since`` (``time.monotonic()``;
    now by default); how long after ``since`` it held."""
    start = time.monotonic() if since is None else since
    while not await check():
        if time.monotonic() - start > bound_s:
            raise AssertionError(f"{what}: not within {bound_s:.1f} s")
        await asyncio.sleep(0.02)
    return time.monotonic() - start
