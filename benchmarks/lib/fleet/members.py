"""The fleet: simulated GPU workers as tasks of this process, one consumer, database pool
and engine each (an engine timed while it has work); members join, drain, or are killed as
close to SIGKILL as a task gets, on the group configuration under test."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

from aiokafka.errors import KafkaError
from aiokafka.protocol.group import LeaveGroupRequest

from benchmarks.lib.engine import Counting
from benchmarks.lib.fleet.configs import Config, first_member_async
from benchmarks.lib.fleet.kill import destroy_without_leaving
from benchmarks.lib.fleet.plan import Move
from benchmarks.lib.greedy import GATES
from benchmarks.lib.stack import Bench
from workers.consumer import Worker
from workers.engines.base import Finished, Generation, GenerationRequest
from workers.engines.sim.engine import SimEngine
from workers.group.threaded_consumer import ThreadedConsumer
from workers.service import working


class Timed(Counting):
    """The counting engine, also timing the wall seconds it had work (a request in it)."""

    def __init__(self, engine: SimEngine) -> None:
        super().__init__(engine)
        self._inside = 0
        self._since = 0.0
        self._busy = 0.0

    def busy_s(self) -> float:
        open_s = time.monotonic() - self._since if self._inside else 0.0
        return self._busy + open_s

    def generate(self, request: GenerationRequest) -> Generation:
        return Generation(self._timed(request))

    async def _timed(self, request: GenerationRequest) -> AsyncGenerator[str | Finished, None]:
        if self._inside == 0:
            self._since = time.monotonic()
        self._inside += 1
        try:
            async with contextlib.aclosing(super().generate(request).items()) as items:
                async for item in items:
                    yield item
        finally:
            self._inside -= 1
            if self._inside == 0:
                self._busy += time.monotonic() - self._since


@dataclass
class Member:
    index: int
    engine: Timed
    stop: asyncio.Event
    instance_id: str | None = None
    task: asyncio.Task[None] | None = None
    worker: Worker | None = None
    left: str | None = None  # "drain" or "kill"

    def holds(self) -> set[int]:
        if self.worker is None:
            return set()
        return {tp.partition for tp in self.worker.consumer.assignment()}

    def assigned(self) -> int:
        return len(self.holds())

    def generation(self) -> int | None:
        """The classic group's generation it joined (None on the consumer protocol)."""
        coordinator = _coordinator(self.worker)
        return None if coordinator is None else int(coordinator.generation)

    def leads(self) -> bool:
        """The classic group's leader: the member that computed the last assignment."""
        coordinator = _coordinator(self.worker)
        return coordinator is not None and coordinator._group_subscription is not None


@dataclass
class Fleet:
    bench: Bench
    args: argparse.Namespace
    config: Config
    members: list[Member] = field(default_factory=list)
    draining: list[asyncio.Task[None]] = field(default_factory=list)
    free_ids: list[str] = field(default_factory=list)  # departed static members' ids

    def join(self) -> Member:
        engine = Timed(
            SimEngine(max_num_seqs=self.args.max_num_seqs, time_scale=self.args.time_scale)
        )
        index = len(self.members)
        instance_id = None
        if self.config.static:
            instance_id = self.free_ids.pop() if self.free_ids else f"fleet-{index}"
        member = Member(index, engine, asyncio.Event(), instance_id)
        settings = self.bench.settings.model_copy(update={"worker_group_instance_id": instance_id})

        async def run() -> None:
            gate_type = GATES[self.args.policy]
            async with working(settings, member.stop, engine=engine, gate_type=gate_type) as worker:
                if worker is not None:
                    member.worker = worker
                    await worker.run(member.stop)

        member.task = asyncio.create_task(run(), name=f"worker-{member.index}")
        self.members.append(member)
        return member

    def alive(self) -> list[Member]:
        return [m for m in self.members if m.left is None]

    def movable(self) -> list[Member]:
        return [m for m in self.alive() if m.worker is not None]

    async def leader(self) -> Member | None:
        """The classic group's leader; on the consumer protocol, the member the broker
        names first."""
        if self.config.protocol == "classic":
            return next((m for m in self.movable() if m.leads()), None)
        s = self.bench.settings
        first = await first_member_async(s.require_kafka(), s.consumer_group)
        for m in self.movable():
            assert m.worker is not None
            if (
                isinstance(m.worker.consumer, ThreadedConsumer)
                and m.worker.consumer.member_id == first
            ):
                return m
        return None

    def _depart(self, member: Member, how: str) -> None:
        member.left = how
        if member.instance_id is not None:
            self.free_ids.append(member.instance_id)

    def drain(self, member: Member) -> None:
        self._depart(member, "drain")
        coordinator = (
            getattr(member.worker.consumer, "_coordinator", None) if member.worker else None
        )
        if self.config.static and self.config.leave and coordinator is not None:
            # A static member of aiokafka never sends LeaveGroup: this one does, by its id.
            async def leave() -> None:
                with contextlib.suppress(KafkaError):
                    await coordinator._send_req(
                        LeaveGroupRequest(coordinator.group_id, coordinator.member_id)
                    )
                coordinator.reset_generation()

            coordinator._maybe_leave_group = leave
        member.stop.set()
        if member.task is not None:
            self.draining.append(member.task)

    def kill(self, member: Member) -> None:
        """As close to SIGKILL as a task gets: no heartbeat, no commit, no leave, its jobs
        stopped where they are; the group waits for the session to time out."""
        self._depart(member, "kill")
        worker = member.worker
        if worker is not None:
            if isinstance(worker.consumer, ThreadedConsumer):
                consumer = worker.consumer
                self.draining.append(
                    asyncio.ensure_future(consumer.call(destroy_without_leaving, nested=False))
                )
            else:
                self._silence(worker)

            async def no_commit() -> None:
                return None

            setattr(worker, "commit", no_commit)  # noqa: B010 (an instance's method)
            for job in list(worker._tasks):
                job.cancel()
        if member.task is not None:
            member.task.cancel()
            self.draining.append(member.task)

    @staticmethod
    def _silence(worker: Worker) -> None:
        """aiokafka's member: its heartbeat stopped, and no LeaveGroup when it closes."""
        coordinator = _coordinator(worker)
        if coordinator is None:
            return
        if coordinator._heartbeat_task is not None:
            coordinator._heartbeat_task.cancel()

        async def no_leave() -> None:
            coordinator.reset_generation()

        coordinator._maybe_leave_group = no_leave

    async def apply(self, move: Move) -> dict[str, Any]:
        if move.kind == "join":
            return {"kind": "join", "worker": self.join().index}
        movable = self.movable()
        if not movable:
            return {"kind": move.kind, "skipped": "no movable worker"}
        leader = await self.leader() if move.leader else None
        member = leader or movable[min(int(move.pick * len(movable)), len(movable) - 1)]
        running, held = member.engine.capacity().running, sorted(member.holds())
        (self.kill if move.kind == "kill" else self.drain)(member)
        entry = {
            "kind": move.kind,
            "worker": member.index,
            "engine_running": running,
            "partitions": held,
        }
        if move.leader:
            entry["leader"] = leader is not None
        return entry

    def settled(self) -> bool:
        """Every partition held by exactly one live member, and every live member holding
        some: the group is serving all of its log (a killed member's partitions are not
        served until the broker reassigns them)."""
        held = [m.holds() for m in self.alive()]
        if not all(held):
            return False
        union = set().union(*held)
        return sum(len(h) for h in held) == len(union) == int(self.args.partitions)

    async def start(self, count: int, within_s: float) -> float:
        """The first member (it forms the group), then the others; seconds until settled."""
        t0 = time.monotonic()
        first = self.join()
        while not first.assigned():
            await self._wait(t0, within_s)
        for _ in range(count - 1):
            self.join()
        while not self.settled():
            await self._wait(t0, within_s)
        return time.monotonic() - t0

    async def _wait(self, t0: float, within_s: float) -> None:
        if time.monotonic() - t0 > within_s:
            raise TimeoutError(f"the group did not settle within {within_s:.0f}s")
        for member in self.members:
            if member.task is not None and member.task.done() and member.left is None:
                member.task.result()  # a worker that died by itself says why
        await asyncio.sleep(0.2)

    async def stop(self) -> None:
        for member in self.alive():
            member.left = "end"
            member.stop.set()
        tasks = [m.task for m in self.members if m.task is not None]
        await asyncio.gather(*tasks, return_exceptions=True)

    def engines(self) -> list[Timed]:
        return [m.engine for m in self.members]


def _coordinator(worker: Worker | None) -> Any:
    """aiokafka's group coordinator of a classic member (None on the consumer protocol)."""
    return getattr(worker.consumer, "_coordinator", None) if worker is not None else None
