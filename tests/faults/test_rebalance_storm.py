"""A rebalance storm: while jobs keep coming, workers join and leave every few seconds, some
drained with SIGTERM, some killed with SIGKILL while they decode; and one worker is frozen
(SIGSTOP) while it decodes until the group has given its jobs to others, then thawed: a
zombie whose jobs go on and end. Every job still reaches exactly one terminal state, written
by the attempt that owns it, with one terminal event; none is left behind, and the group's
committed offsets reach the end of every dispatch partition."""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from plumbing.settings import Settings
from schemas.envelopes import JobEvent
from schemas.states import TERMINAL_STATES, JobState
from schemas.tables import jobs, outbox
from sluicegate.local.embedded import free_port
from tests.faults.outcomes import DOC, states, until
from tests.faults.processes import Role, Roles, holds, jobs_running, roles
from tests.integration.serving import serve
from tests.support.topics import caught_up
from workers.repository import ClaimedJob, WorkerRepository

pytestmark = pytest.mark.timeout(300)

JOBS = 120
SUBMIT_S = 30.0  # the jobs come at a steady pace over this long
STORM_S = 36.0  # workers join and leave for this long
STEP_S = (2.0, 4.0)  # between two moves of the storm
MOST = 3  # workers alive at once, at most (the anchor always)
DRAIN_S = 3.0  # a leaving worker's drain: within the group's rebalance timeout (10 s)
DECODING_WAIT_S = 8.0  # how long a leave waits for a worker to decode
FREEZE_MAX_S = 60.0  # a frozen worker thaws once its jobs were taken over, or after this
STARTUP_S = 60.0  # for a worker process to serve its metrics (a loaded machine is slow)
# The zombie's control sweep is slow: it does not learn of the takeover from the database
# before its jobs end, so only the attempt fence stands between it and a second result.
ZOMBIE_SWEEP_S = 120.0
# The zombie's revoke, as it thaws, lets its jobs end for this long before it cancels them:
# its frozen jobs still had seconds to decode, and only a job that ends meets the fence.
# Within the group's rebalance timeout (10 s).
ZOMBIE_DRAIN_S = 8.0
SEED = 20261207  # the storm's moves are the same on every run; their timing is not
TERMINAL = {s.value for s in TERMINAL_STATES}


@dataclass
class Member:
    """A worker process of the storm, with the port its metrics are scraped on."""

    role: Role
    port: int
    left: str | None = None  # "kill" or "term", once the storm made it leave


@dataclass
class Storm:
    started: Roles
    db: AsyncEngine
    probe: httpx.AsyncClient
    rng: random.Random = field(default_factory=lambda: random.Random(SEED))
    members: list[Member] = field(default_factory=list)
    # The first worker stays through the storm: it formed the group, so it is the group's
    # leader (the member that computes the assignment). Tansu 0.6, the embedded broker,
    # keeps an evicted leader as the leader of the next rebalance and the group never
    # forms again; Apache Kafka elects another. The storm is in the members that come and
    # go beside the leader.
    anchor: Member | None = None
    zombie: Member | None = None  # frozen once; a member like the others after
    freezing: bool = False
    kills: int = 0
    kills_mid_decode: int = 0
    taken_over_while_frozen: int = 0
    drains: list[tuple[Member, asyncio.Task[int]]] = field(default_factory=list)

    def alive(self) -> list[Member]:
        return [m for m in self.members if m.left is None]

    def movable(self) -> list[Member]:
        """The members the storm may stop now, oldest first."""
        frozen = self.zombie if self.freezing else None
        return [m for m in self.alive() if m is not self.anchor and m is not frozen]

    def join(self, **overrides: object) -> Member:
        port = free_port()
        settings = {"drain_timeout_s": DRAIN_S, **overrides}
        role = self.started.start("worker", metrics_port=port, **settings)
        member = Member(role, port)
        self.members.append(member)
        return member

    async def running(self, member: Member) -> int | None:
        """Jobs running on the member, from its metrics (None until it serves them)."""
        return await jobs_running(self.probe, member.port)

    async def up(self, member: Member) -> None:
        """Until the member serves its metrics: by then its SIGTERM handler is set."""
        async with asyncio.timeout(STARTUP_S):
            while await self.running(member) is None:
                assert member.role.process.poll() is None, member.role.output()[-3000:]
                await asyncio.sleep(0.1)

    async def decoding(self, member: Member, within_s: float = DECODING_WAIT_S) -> bool:
        """Whether the member runs jobs (waiting up to ``within_s`` for it to)."""
        return await self.busiest([member], within_s) is not None

    async def busiest(self, members: list[Member], within_s: float) -> Member | None:
        """The member running the most jobs, once one runs at least two (None if none
        does within ``within_s``)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within_s
        while loop.time() < deadline:
            counts = [(await self.running(m) or 0, i) for i, m in enumerate(members)]
            most, i = max(counts)
            if most >= 2:
                return members[i]
            await asyncio.sleep(0.1)
        return None

    def kill(self, member: Member, *, decoding: bool) -> None:
        """kill -9: no drain, no goodbye to the group."""
        member.left = "kill"
        member.role.kill()
        self.kills += 1
        self.kills_mid_decode += decoding

    async def terminate(self, member: Member) -> None:
        """SIGTERM: it drains in the background while the storm goes on."""
        member.left = "term"
        await self.up(member)
        member.role.process.send_signal(signal.SIGTERM)
        wait = asyncio.to_thread(member.role.process.wait, DRAIN_S + 60)
        self.drains.append((member, asyncio.create_task(wait)))

    async def _running_on(self, member: Member) -> list[str]:
        """The running jobs of the partitions ``member`` holds, once it decodes and there
        are some (the storm moves partitions meanwhile: its list is read again each time);
        none if that does not come within FREEZE_MAX_S."""
        try:
            async with asyncio.timeout(FREEZE_MAX_S):
                while True:
                    if await self.decoding(member, within_s=FREEZE_MAX_S):
                        partitions = holds(member.role)
                        async with self.db.connect() as conn:
                            running = await conn.scalars(
                                select(jobs.c.id).where(
                                    jobs.c.state == JobState.RUNNING.value,
                                    jobs.c.dispatch_partition.in_(partitions),
                                )
                            )
                            ids = [str(job) for job in running]
                        if ids:
                            return ids
                    await asyncio.sleep(0.2)
        except TimeoutError:
            return []

    async def freeze(self, member: Member) -> None:
        """SIGSTOP while it decodes, past its session timeout; SIGCONT as soon as a job
        of its partitions that was running then has been claimed again (the group gave
        the frozen worker's partitions away), so the new attempts still decode when the
        zombie's own resume. A job of another worker's partitions taken over meanwhile (a
        kill of the storm) says nothing of the zombie: it is not counted."""
        self.zombie, self.freezing = member, True
        try:
            ids = await self._running_on(member)
            if not ids:
                return
            before = await states(self.db, ids)
            member.role.process.send_signal(signal.SIGSTOP)
            try:
                async with asyncio.timeout(FREEZE_MAX_S):
                    while not self.taken_over_while_frozen:
                        now = await states(self.db, list(before))
                        again = [j for j, (_, attempt) in now.items() if attempt > before[j][1]]
                        self.taken_over_while_frozen = len(again)
                        await asyncio.sleep(0.1)
            except TimeoutError:
                pass  # the assertion on taken_over_while_frozen says so
            finally:
                member.role.process.send_signal(signal.SIGCONT)
            # Its jobs end and are fenced off: within its revoke's drain (classic), or as
            # they end while it runs on with its partitions lost (the consumer protocol
            # keeps no drain for lost partitions). It is not stopped before (or a while).
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(FREEZE_MAX_S):
                    while "was fenced off" not in member.role.output():
                        await asyncio.sleep(0.2)
        finally:
            self.freezing = False

    async def leave(self) -> None:
        """The movable member running the most jobs leaves (waiting a while for one to
        decode; else the oldest): killed until a kill has caught a worker decoding (so the
        jobs it leaves behind are surely its own), drained at the next leave, then killed
        and drained in turn."""
        movable = self.movable()
        busiest = await self.busiest(movable, DECODING_WAIT_S)
        leaves = sum(m.left is not None for m in self.members)
        if not self.kills_mid_decode or (self.drains and leaves % 2 == 0):
            self.kill(busiest or movable[0], decoding=busiest is not None)
        else:
            await self.terminate(busiest or movable[0])

    async def blow(self, for_s: float, zombie: Member) -> None:
        """Every 2-4 s a worker joins, one leaves, or both (1 to MOST alive); the zombie
        is frozen meanwhile, once."""
        freezing = asyncio.create_task(self.freeze(zombie))
        loop = asyncio.get_running_loop()
        end = loop.time() + for_s
        while loop.time() < end:
            await asyncio.sleep(self.rng.uniform(*STEP_S))
            moves = []
            if len(self.alive()) < MOST:
                moves.append("join")
            if self.movable():
                moves += ["leave", "swap"]
            move = self.rng.choice(moves)
            if move in ("join", "swap"):
                self.join()
            if move in ("leave", "swap"):
                await self.leave()
        await freezing

    async def settle(self, count: int) -> None:
        """Leave ``count`` workers to finish: start or drain the difference (one more
        started and drained if the storm's moves drained none)."""
        if not self.drains and len(self.alive()) <= count:
            self.join()
        while len(self.alive()) < count:
            self.join()
        while len(self.alive()) > count:
            await self.terminate(self.movable()[0])


async def submit(api: httpx.AsyncClient) -> list[str]:
    """JOBS jobs at a steady pace over SUBMIT_S; each decodes for a few seconds."""
    ids = []
    for i in range(JOBS):
        r = await api.post(
            "/v1/jobs",
            json={"kind": "complete", "input": DOC, "max_tokens": 150 + 50 * (i % 6), "ttl_s": 900},
        )
        assert r.status_code == 202, r.text
        ids.append(r.json()["id"])
        await asyncio.sleep(SUBMIT_S / JOBS)
    return ids


async def ended(db: AsyncEngine, ids: list[str], within_s: float) -> None:
    """Until every job is terminal; says which are not if that does not come."""
    try:
        await until(db, ids, lambda s: all(st in TERMINAL for st, _ in s.values()), within_s)
    except TimeoutError:
        left = Counter(st for st, _ in (await states(db, ids)).values() if st not in TERMINAL)
        pytest.fail(f"jobs left non-terminal: {dict(left)}")


async def test_a_rebalance_storm_loses_and_duplicates_nothing(
    settings: Settings, db: AsyncEngine, tmp_path: Path
) -> None:
    # The API's deadline-aware admission would refuse jobs while the storm stalls the
    # group's drain rate (a correct, explicit refusal, but not what is tested here).
    api_settings = settings.model_copy(update={"deadline_aware": False})
    with roles(settings, tmp_path) as started:
        started.start("relay")
        async with serve(api_settings, db) as api, httpx.AsyncClient() as probe:
            storm = Storm(started, db, probe)
            storm.anchor = storm.join()
            submitting = asyncio.create_task(submit(api))
            # The storm begins under load: the anchor decodes alone (it formed the group,
            # it is the leader), then the zombie-to-be decodes beside it.
            assert await storm.decoding(storm.anchor, within_s=STARTUP_S)
            zombie = storm.join(control_sweep_s=ZOMBIE_SWEEP_S, drain_timeout_s=ZOMBIE_DRAIN_S)
            assert await storm.decoding(zombie, within_s=STARTUP_S)
            await storm.blow(STORM_S, zombie)
            ids = await submitting
            await storm.settle(2)
            await ended(db, ids, within_s=120)
            await caught_up(
                settings.require_kafka(),
                settings.consumer_group,
                settings.dispatch_topic,
                settings.partitions,
                within_s=60,
            )
            # No worker that the storm left alone exited by itself.
            gone = [
                m.role.output()[-3000:] for m in storm.alive() if m.role.process.poll() is not None
            ]
            assert not gone, gone
        codes = await asyncio.gather(*(t for _, t in storm.drains), return_exceptions=True)

    assert storm.drains, "the storm must drain a worker with SIGTERM"
    failed = [
        (code, m.role.output()[-3000:])
        for (m, _), code in zip(storm.drains, codes, strict=True)
        if code != 0
    ]
    assert not failed, failed  # each drained worker exited cleanly
    assert storm.kills_mid_decode >= 1, "the storm must kill a worker while it decodes"
    assert storm.taken_over_while_frozen, "the frozen worker's jobs must be taken over"

    final = await states(db, ids)
    assert Counter(state for state, _ in final.values()) == Counter({"succeeded": JOBS})
    taken_over = [job for job, (_, attempt) in final.items() if attempt >= 2]
    assert taken_over, "workers were killed and frozen mid-decode; their jobs must run again"

    async with db.connect() as conn:
        payloads = await conn.scalars(
            select(outbox.c.payload).where(outbox.c.topic == settings.events_topic)
        )
        events = [JobEvent.model_validate_json(p) for p in payloads]
    ends = [e for e in events if e.state.value in TERMINAL]
    # One terminal event per job, written by the attempt that owns the job: no attempt that
    # was taken over (killed, frozen, drained or revoked) wrote its result.
    assert Counter(e.job_id for e in ends) == Counter(dict.fromkeys(ids, 1))
    stale = [(e.job_id, e.attempt) for e in ends if e.attempt != final[e.job_id][1]]
    assert stale == []
    # The fence turned the zombie's taken-over jobs away after it thawed: at their end
    # write, or mid-decode where its sweep found the new attempt first.
    assert "was fenced off" in zombie.role.output()


async def test_a_job_taken_over_by_an_attempt_that_never_runs_is_claimed_back(
    settings: Settings, db: AsyncEngine, tmp_path: Path
) -> None:
    """The storm's zombie, alone: a worker expelled from the group still claims a job of
    a partition it lost (a record it had fetched), then its revoke drops the claim. The
    owner's attempt is taken over by one that never runs; the owner must neither commit
    past the job nor give it up, but claim it back once the other attempt had its drain."""
    with roles(settings, tmp_path) as started:
        started.start("relay")
        started.start("worker", drain_timeout_s=DRAIN_S, sim_time_scale=3.0)
        async with serve(settings, db) as api:
            r = await api.post(
                "/v1/jobs", json={"kind": "complete", "input": DOC, "max_tokens": 300}
            )
            assert r.status_code == 202, r.text
            job = r.json()["id"]
            await until(db, [job], lambda s: s[job] == ("running", 1), 60)
            # The zombie's claim, through the workers' own repository, never run.
            zombie = WorkerRepository(db, events_topic=settings.events_topic)
            taken = (await zombie.claim_batch([job], lambda _: None, len))[job]
            assert isinstance(taken, ClaimedJob)
            assert taken.attempt == 2
            await ended(db, [job], within_s=60)
            await caught_up(
                settings.require_kafka(),
                settings.consumer_group,
                settings.dispatch_topic,
                settings.partitions,
            )

    assert (await states(db, [job]))[job] == ("succeeded", 3)
    async with db.connect() as conn:
        payloads = await conn.scalars(
            select(outbox.c.payload).where(outbox.c.topic == settings.events_topic)
        )
        ends = [
            e.attempt
            for e in map(JobEvent.model_validate_json, payloads)
            if e.job_id == job and e.state.value in TERMINAL
        ]
    assert ends == [3]
