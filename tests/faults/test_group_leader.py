"""kill -9 the worker that leads the consumer group while it decodes: the broker evicts it
after the session timeout, the group re-forms without it, the dead leader's jobs run again
elsewhere, and every job ends exactly once. On the classic protocol the leader is the member
that computed the group's assignment, and a new one is elected; the consumer protocol
(KIP-848) has none (the broker assigns), and the member the broker names first is killed.
(Tansu, the fallback broker, cannot re-form a group without its leader.)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient
from sqlalchemy.ext.asyncio import AsyncEngine

from plumbing.settings import Settings
from sluicegate.local.embedded import free_port
from tests.faults.outcomes import all_ended, exactly_once, outcome, running, submit, until
from tests.faults.processes import Role, assigned, roles, running_at_least
from tests.integration.serving import serve

pytestmark = pytest.mark.timeout(300)

DOC = "The leader of a consumer group is only the member that computes the assignment. " * 6
LEADS = "Elected group leader"
MEMBER = re.compile(r"joined group \S+ as member (\S+)")


def first_member(settings: Settings, members: list[Role]) -> Role:
    """The worker the broker names first in the group (the consumer protocol's)."""
    admin = AdminClient({"bootstrap.servers": settings.require_kafka()})
    group = settings.consumer_group
    described = admin.describe_consumer_groups([group])[group].result(timeout=10)
    first = described.members[0].member_id
    return next(m for m in members if first in MEMBER.findall(m.output()))


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
async def test_the_group_leader_killed_mid_decode_and_the_group_reforms(
    settings: Settings, db: AsyncEngine, tmp_path: Path, kafka_is_tansu: bool, protocol: str
) -> None:
    if kafka_is_tansu:
        pytest.skip("Tansu keeps an evicted leader and the group never forms again")
    with roles(settings, tmp_path) as started:
        started.start("relay")
        slow = {"sim_time_scale": 3.0, "worker_max_running": 4, "worker_group_protocol": protocol}
        ports = {n: free_port() for n in (1, 2, 3)}

        def worker(n: int) -> Role:
            return started.start(
                "worker", worker_group_instance_id=f"worker-{n}", metrics_port=ports[n], **slow
            )

        first = worker(1)
        await assigned(first)  # alone in the group: it leads it
        others = [worker(n) for n in (2, 3)]
        for other in others:
            await assigned(other)
        if protocol == "classic":
            # The joins rebalanced the group (once, or once each), led by the first again.
            assert first.output().count(LEADS) >= 2
            assert not [o for o in others if LEADS in o.output()]
            leader = first
        else:
            leader = first_member(settings, [first, *others])
        members = [first, *others]  # worker-1, worker-2, worker-3
        others = [o for o in members if o is not leader]

        async with serve(settings, db) as api:
            ids = await submit(api, 24, input=DOC, max_tokens=300, ttl_s=900)
            await until(db, ids, lambda s: running(s) >= 6, 90)
            # The leader itself runs jobs when it dies.
            await running_at_least(ports[1 + members.index(leader)], 1, within_s=60)
            leader.kill()
            await until(db, ids, all_ended, 180)
        if protocol == "classic":
            new_leaders = [o for o in others if LEADS in o.output()]
            assert len(new_leaders) == 1, "the group must re-form under one new leader"
        for other in others:
            assert other.process.poll() is None, other.output()[-2000:]

    result = await outcome(settings, db, ids)
    print(f"group leader killed: {result.summary()}")
    exactly_once(result, ids)
    assert result.taken_over > 0, "the leader decoded when it died: its jobs ran again"
