"""The group configurations the fleet benchmark compares through one storm: how members
join, leave and are assigned partitions."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Literal

from confluent_kafka.admin import AdminClient


@dataclass(frozen=True)
class Config:
    name: str
    protocol: Literal["classic", "consumer"]
    static: bool  # members have a group.instance.id; a join takes a departed one's id
    leave: bool  # a drained member leaves the group explicitly
    about: str


CONFIGS = {
    c.name: c
    for c in (
        Config(
            "eager",
            "classic",
            static=False,
            leave=True,
            about="aiokafka's eager protocol, dynamic members: every move revokes every "
            "partition of every member",
        ),
        Config(
            "static",
            "classic",
            static=True,
            leave=False,
            about="KIP-345 on the eager protocol: a join takes a departed member's id; a "
            "leaving member does not leave, its partitions wait the session timeout",
        ),
        Config(
            "static-leave",
            "classic",
            static=True,
            leave=True,
            about="KIP-345 on the eager protocol, a drained member sends LeaveGroup itself",
        ),
        Config(
            "consumer",
            "consumer",
            static=False,
            leave=True,
            about="KIP-848 (group.protocol=consumer, confluent-kafka): the broker assigns "
            "incrementally, only the partitions that move are revoked",
        ),
        Config(
            "consumer-static",
            "consumer",
            static=True,
            leave=False,
            about="KIP-848 with group.instance.id: a join takes a departed member's id and "
            "its partitions back; a leaving member's wait the session timeout",
        ),
    )
}


def first_member(bootstrap: str, group: str) -> str | None:
    """The member id the broker names first in the group (KIP-848 has no leader)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    described = admin.describe_consumer_groups([group])[group].result(timeout=10)
    return described.members[0].member_id if described.members else None


async def first_member_async(bootstrap: str, group: str) -> str | None:
    return await asyncio.to_thread(first_member, bootstrap, group)
