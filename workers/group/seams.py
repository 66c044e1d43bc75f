"""The typed seams between the worker and its group: the consumer it reads and commits
through (aiokafka's on the classic protocol, ``ThreadedConsumer`` on the consumer one) and
the rebalance listener that consumer calls, as aiokafka's ``aiokafka/abc.py`` shapes its
``ConsumerRebalanceListener``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from aiokafka import TopicPartition


class FetchedRecord(Protocol):
    """A fetched record, as the worker reads it."""

    @property
    def offset(self) -> int: ...

    @property
    def value(self) -> bytes | None: ...


class RebalanceListener(Protocol):
    """Told of the partitions a rebalance takes from the member and gives it; the consumer
    waits for each call to end before it goes on."""

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None: ...

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None: ...


class GroupConsumer(Protocol):
    """A member of the worker group: the calls the worker makes of it."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def subscribe(self, topics: list[str], listener: RebalanceListener) -> None: ...

    async def getmany(
        self, timeout_ms: int = 0, max_records: int = 1
    ) -> Mapping[TopicPartition, Sequence[FetchedRecord]]: ...

    def pause(self, *partitions: TopicPartition) -> None: ...

    def resume(self, *partitions: TopicPartition) -> None: ...

    def seek(self, tp: TopicPartition, offset: int) -> None: ...

    async def commit(self, offsets: dict[TopicPartition, int]) -> None: ...

    def assignment(self) -> set[TopicPartition]: ...
