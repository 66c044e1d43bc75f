"""Small asyncio helpers shared by the long-running loops."""

from __future__ import annotations

import asyncio


async def wait_first(*events: asyncio.Event, limit_s: float | None = None) -> None:
    """Return when any of the events is set, or after ``limit_s`` seconds."""
    waiters = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waiters, timeout=limit_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
