"""The fleet: simulated GPU workers as tasks of this process, one consumer, database pool
and engine each (an engine timed while it has work); members join, drain, or are killed as
close to SIGKILL as a task gets."""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from benchmarks.lib.engine import Counting
from benchmarks.lib.fleet.plan import Move
from benchmarks.lib.stack import Bench
from workers.consumer import Worker
from workers.engines.base import GenerationRequest
from workers.engines.sim.engine import SimEngine
from workers.service import run_worker


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

    async def generate(self, request: GenerationRequest) -> AsyncIterator[str]:
        if self._inside == 0:
            self._since = time.monotonic()
        self._inside += 1
        try:
            async for piece in super().generate(request):
                yield piece
        finally:
            self._inside -= 1
            if self._inside == 0:
                self._busy += time.monotonic() - self._since


@dataclass
class Member:
    index: int
    engine: Timed
    stop: asyncio.Event
    task: asyncio.Task[None] | None = None
    worker: Worker | None = None
    left: str | None = None  # "drain" or "kill"

    def assigned(self) -> int:
        if self.worker is None:
            return 0
        return len(self.worker.consumer.assignment())

    def generation(self) -> int | None:
        if self.worker is None:
            return None
        coordinator = self.worker.consumer._coordinator
        return None if coordinator is None else int(coordinator.generation)


@dataclass
class Fleet:
    bench: Bench
    args: argparse.Namespace
    members: list[Member] = field(default_factory=list)
    draining: list[asyncio.Task[None]] = field(default_factory=list)

    def join(self) -> Member:
        engine = Timed(
            SimEngine(max_num_seqs=self.args.max_num_seqs, time_scale=self.args.time_scale)
        )
        member = Member(len(self.members), engine, asyncio.Event())

        def seen(worker: Worker) -> None:
            member.worker = worker

        member.task = asyncio.create_task(
            run_worker(self.bench.settings, member.stop, engine=engine, on_worker=seen),
            name=f"worker-{member.index}",
        )
        self.members.append(member)
        return member

    def alive(self) -> list[Member]:
        return [m for m in self.members if m.left is None]

    def movable(self) -> list[Member]:
        """Every live member but the anchor (the group's leader, never stopped)."""
        return [m for m in self.alive() if m.index != 0 and m.worker is not None]

    def drain(self, member: Member) -> None:
        member.left = "drain"
        member.stop.set()
        if member.task is not None:
            self.draining.append(member.task)

    def kill(self, member: Member) -> None:
        """As close to SIGKILL as a task gets: no heartbeat, no commit, no LeaveGroup, its
        jobs stopped where they are; the group waits for the session to time out."""
        member.left = "kill"
        worker = member.worker
        if worker is not None:
            coordinator = worker.consumer._coordinator
            if coordinator is not None:
                heartbeat = coordinator._heartbeat_task
                if heartbeat is not None:
                    heartbeat.cancel()

                async def no_leave() -> None:
                    coordinator.reset_generation()

                coordinator._maybe_leave_group = no_leave

            async def no_commit() -> None:
                return None

            setattr(worker, "commit", no_commit)  # noqa: B010 (an instance's method)
            for job in list(worker._tasks):
                job.cancel()
        if member.task is not None:
            member.task.cancel()
            self.draining.append(member.task)

    def apply(self, move: Move) -> dict[str, Any]:
        if move.kind == "join":
            member = self.join()
        else:
            movable = self.movable()
            if not movable:
                return {"kind": move.kind, "skipped": "no movable worker"}
            member = movable[min(int(move.pick * len(movable)), len(movable) - 1)]
            running = member.engine.capacity().running
            (self.kill if move.kind == "kill" else self.drain)(member)
            return {"kind": move.kind, "worker": member.index, "engine_running": running}
        return {"kind": "join", "worker": member.index}

    def settled(self) -> bool:
        """Every live member holds partitions, all of one generation."""
        alive = self.alive()
        generations = {m.generation() for m in alive}
        return all(m.assigned() for m in alive) and len(generations) == 1

    async def start(self, count: int, within_s: float) -> float:
        """The anchor first (it forms the group), then the others; seconds until settled."""
        t0 = time.monotonic()
        anchor = self.join()
        while not anchor.assigned():
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
