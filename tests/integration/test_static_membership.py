"""Static membership on Apache Kafka, on either group protocol (KIP-345 on the classic one,
its KIP-848 form on the consumer one): a worker with a `worker_group_instance_id`
restarted within the session timeout gets its partitions back and the other worker is
neither revoked nor given any; without one, the same restart moves partitions twice (the
leave, then the join)."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from plumbing.settings import Settings
from tests.faults.processes import Role, assigned, holds, roles
from tests.integration.serving import serve

pytestmark = pytest.mark.timeout(180)

JOINED = re.compile(r"Joined group '[^']+' \(generation (\d+)\)")
# Longer than either heartbeat interval (3 s classic, 1 s consumer): a move would have
# reached the other worker.
QUIET_S = 5.0


def generations(role: Role) -> list[int]:
    return [int(g) for g in JOINED.findall(role.output())]


async def settled(*members: Role, partitions: int = 4, within_s: float = 60) -> None:
    """Until the members' holdings (from their logs) are disjoint and cover the topic."""
    async with asyncio.timeout(within_s):
        while True:
            held = [holds(m) for m in members]
            if all(held) and sum(map(len, held)) == len(set().union(*held)) == partitions:
                return
            await asyncio.sleep(0.2)


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
@pytest.mark.parametrize("static", [True, False], ids=["static", "dynamic"])
async def test_a_restarted_worker_takes_its_partitions_back(
    settings: Settings,
    db: AsyncEngine,
    tmp_path: Path,
    static: bool,
    protocol: str,
    kafka_is_tansu: bool,
) -> None:
    if kafka_is_tansu:
        pytest.skip("static membership is Apache Kafka's (docs/operations.md, Brokers)")
    ids = {"w1": "worker-1", "w2": "worker-2"} if static else {"w1": None, "w2": None}
    own = {"worker_group_protocol": protocol}
    with roles(settings, tmp_path) as started:
        w1 = started.start("worker", worker_group_instance_id=ids["w1"], **own)
        await assigned(w1)
        w2 = started.start("worker", worker_group_instance_id=ids["w2"], **own)
        held = await assigned(w2)
        assert held, "two workers share four partitions"
        await settled(w1, w2)  # the group moved partitions to w2
        before = len(w1.output())
        generation = generations(w1)[-1] if protocol == "classic" else None

        code, _ = w2.terminate(timeout_s=30)
        assert code == 0
        again = started.start("worker", worker_group_instance_id=ids["w2"], **own)
        taken = await assigned(again)
        await asyncio.sleep(QUIET_S)
        after = w1.output()[before:]

        if static:
            assert taken == held  # the same partitions
            assert "revoked partitions" not in after, after  # the other never revoked
            assert "assigned partitions" not in after, after  # nor was given any
            if protocol == "classic":
                assert generations(again) == [generation]  # in the same generation
                assert not generations(w1)[-1] > generation
        else:
            assert "revoked partitions" in after
            if protocol == "classic":
                assert generations(w1)[-1] > generation

        # The group serves: jobs submitted now are run.
        started.start("relay")
        async with serve(settings, db) as api:
            jobs = []
            for _ in range(4):
                r = await api.post("/v1/jobs", json={"kind": "summarize", "input": "Static."})
                assert r.status_code == 202, r.text
                jobs.append(r.json()["id"])
            async with asyncio.timeout(60):
                for job in jobs:
                    while (await api.get(f"/v1/jobs/{job}")).json()["state"] != "succeeded":
                        await asyncio.sleep(0.2)
