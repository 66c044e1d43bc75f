"""The lag monitor's reader: the worker group's committed offsets from the broker, then the rest
of the reading from PostgreSQL (``LagRepository``)."""

from __future__ import annotations

from collections.abc import Callable

from aiokafka.errors import KafkaError
from sqlalchemy.ext.asyncio import AsyncEngine

from plumbing.kafka import GroupReader
from producers.lag.repository import LagRepository
from producers.lag.rule import Reading


class KafkaLagSource:
    """Committed offsets from the broker (``GroupReader``: the admin API), then in one
    PostgreSQL snapshot: the ends from the relay's record, the unpublished jobs and
    (``count_open``) the jobs not yet ended past the commit points."""

    def __init__(
        self,
        *,
        db: AsyncEngine,
        bootstrap: str,
        topic: str,
        group_id: str,
        partitions: int,
        count_open: bool = True,
        first: bool = True,
    ) -> None:
        self._topic = topic
        self._partitions = partitions
        self._reader = GroupReader(bootstrap, group_id)
        self._repository = LagRepository(
            db, topic=topic, partitions=partitions, count_open=count_open, first=first
        )

    async def read(self, mark: Callable[[], int] | None = None) -> Reading:
        """``mark`` is read as the PostgreSQL snapshot begins (``Reading.mark``)."""
        # The commit points first: the ends and the open jobs read after them are at or
        # past them.
        return await self._repository.reading(await self.committed(), mark)

    async def committed(self) -> dict[int, int]:
        """The worker group's committed offset per partition (0 where none)."""
        try:
            return await self._reader.committed(self._topic, self._partitions)
        except (KafkaError, OSError):
            await self.close()
            raise

    async def close(self) -> None:
        await self._reader.close()
