"""The worker's rebalance listener, on either protocol: a revoke drains only the revoked
partitions' jobs (bounded by the drain timeout) and commits them; an assignment is paused
at once if the worker is waiting for room. Both are counted for the rebalance panel."""

from __future__ import annotations

import logging
from typing import Protocol

from aiokafka import TopicPartition
from aiokafka.abc import ConsumerRebalanceListener

from workers.group.seams import GroupConsumer
from workers.metrics import GENERATION, PARTITIONS, REVOKED

log = logging.getLogger("workers.consumer")


class Member(Protocol):
    @property
    def consumer(self) -> GroupConsumer: ...

    async def finish_partitions(
        self, partitions: set[TopicPartition], deadline: float | None = None
    ) -> None: ...

    def assigned(self, partitions: set[TopicPartition]) -> None: ...


class Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, member: Member) -> None:
        self._member = member

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        REVOKED.inc(len(revoked))
        await self._member.finish_partitions(set(revoked))
        held = self._member.consumer.assignment() - set(revoked)
        PARTITIONS.set(len(held))
        log.info("revoked partitions %s; holding %s", _numbers(revoked), _numbers(held))

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self._member.assigned(set(assigned))
        held = self._member.consumer.assignment()
        PARTITIONS.set(len(held))
        log.info("assigned partitions %s; holding %s", _numbers(assigned), _numbers(held))
        if coordinator := getattr(self._member.consumer, "_coordinator", None):
            GENERATION.set(coordinator.generation)  # classic only


def _numbers(partitions: set[TopicPartition]) -> list[int]:
    return sorted(tp.partition for tp in partitions)
