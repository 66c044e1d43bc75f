"""Attempts recorded together: each finished attempt joins the next write, and a write
starts as soon as the one before it ends, so a burst of attempts ending together costs one
statement and a lone attempt waits for none."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from workers.webhooks.attempt_repository import Attempted

# Writes the attempts; the ids of the deliveries that were still theirs.
Write = Callable[[Sequence[Attempted]], Awaitable[set[str]]]


class Recorder:
    def __init__(self, write: Write) -> None:
        self._write = write
        self._waiting: list[tuple[Attempted, asyncio.Future[bool]]] = []
        self._writing: asyncio.Task[None] | None = None

    async def record(self, attempted: Attempted) -> bool:
        """Record ``attempted`` with whatever else is waiting: whether its delivery was
        still its own. A failed write raises here, for every attempt it held."""
        done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._waiting.append((attempted, done))
        if self._writing is None:
            self._writing = asyncio.create_task(self._write_all(), name="webhook-record")
        return await asyncio.shield(done)

    async def _write_all(self) -> None:
        try:
            while self._waiting:
                batch, self._waiting = self._waiting, []
                try:
                    owned = await self._write([a for a, _ in batch])
                except Exception as exc:
                    for _, done in batch:
                        done.set_exception(exc)
                    continue
                for attempted, done in batch:
                    done.set_result(attempted.claimed.id in owned)
        finally:
            self._writing = None
