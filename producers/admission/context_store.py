"""The context of a pool's engines as their workers report it (``workers.context_tokens``)."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from schemas.tables import workers

SEEN_WITHIN_S = 120.0  # a worker not seen for longer is not counted


class ContextStore:
    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    async def smallest(self, model: str) -> int | None:
        """The smallest context of the live workers serving ``model`` (None: none known)."""
        query = select(func.min(workers.c.context_tokens)).where(
            workers.c.model == model,
            workers.c.seen_at > func.now() - timedelta(seconds=SEEN_WITHIN_S),
        )
        async with self._engine.connect() as conn:
            found = await conn.scalar(query)
        return int(found) if found is not None else None
