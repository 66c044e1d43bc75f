"""The worker's consumer loop: take a record only when the engine can start its job, pause
the partitions while it cannot, pass what fits through the pre-decode gate in one claim per
batch, commit each partition up to its lowest unfinished job."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass

from aiokafka import TopicPartition
from aiokafka.errors import KafkaError
from confluent_kafka import KafkaException
from pydantic import ValidationError

from plumbing.kafka import ClusterIdReader
from plumbing.retry import Backoff, Stopped, outage, retrying, wait_first
from schemas.envelopes import DispatchEnvelope
from workers.dead_letter_store import record_subject
from workers.execution import Executor, Progress
from workers.gate import Drop, PullGate
from workers.group.listener import Rebalance
from workers.group.offsets import OffsetTracker
from workers.group.seams import FetchedRecord, GroupConsumer
from workers.metrics import DEAD_LETTERED, DROPPED, JOBS_RUNNING, PAUSED_SECONDS
from workers.repository import ClaimedJob

log = logging.getLogger(__name__)

FETCH_TIMEOUT_MS = 500
# While paused, how often capacity is looked at again and the broker polled to stay in the group.
RECHECK_S = 0.05
COMMIT_ERRORS = (KafkaError, KafkaException)


@dataclass(frozen=True)
class Held:
    """The one record taken from Kafka whose job cannot start yet."""

    tp: TopicPartition
    offset: int
    envelope: DispatchEnvelope


@dataclass(frozen=True)
class Started:
    """A job running here: its record, and the offsets (of the cluster that record was read
    from) in which it counts."""

    tp: TopicPartition
    offset: int
    job_id: str
    offsets: OffsetTracker[TopicPartition]


class Worker:
    """One member of the worker consumer group.

    It takes one record at a time, and only when it could start a job now; a record whose
    job does not fit is held (never more than one) and the assigned partitions are paused
    (no rebalance: the group sees a slow member, Kafka sees lag, the producers push back)
    until a job ends and frees room. Each partition is committed only up to the lowest
    offset whose job is not yet terminal.

    A revoke drains only the revoked partitions' jobs and hands what outlasts the drain to
    the partitions' next owner (it reads them again from the committed offset). When the
    broker's data was replaced (a new cluster id), nobody can be handed them: they run to
    their end here, and the old cluster's offsets are never committed to the new one.
    """

    def __init__(
        self,
        *,
        consumer: GroupConsumer,
        gate: PullGate,
        executor: Executor,
        topic: str,
        bootstrap: str,
        drain_timeout_s: float,
        claim_batch: int = 64,
    ) -> None:
        self.consumer = consumer
        self.gate = gate
        self.executor = executor
        self._topic = topic
        self._cluster_ids = ClusterIdReader(bootstrap)  # one client, for every check
        self._cluster: str | None = None
        self._drain_timeout_s = drain_timeout_s
        self._claim_batch = claim_batch
        # Records taken and fitted, being judged and claimed (a revoke may drop some).
        self._batch: list[tuple[Held, Progress]] = []
        self._offsets: OffsetTracker[TopicPartition] = OffsetTracker()
        self._tasks: dict[asyncio.Task[None], Started] = {}
        # Set once the batch being claimed now has been started (None: no claim under way).
        self._claimed: asyncio.Event | None = None
        self._changed = gate.room_changed  # set by the gate too: room, before a job's end
        self._commit_lock = asyncio.Lock()
        self._recommit = Backoff()  # a failed commit is tried again, whatever ends next
        self._paused_since: float | None = None
        self.held: Held | None = None

    @property
    def running(self) -> int:
        return len(self._tasks)

    async def run(self, stop: asyncio.Event) -> None:
        read = self._cluster_ids.read  # the cluster our offsets will index
        try:
            self._cluster = await retrying("worker_cluster_id", read, stop=stop, transient=outage)
        except Stopped:  # stopped while the broker could not be reached
            await self._cluster_ids.close()
            return
        self.consumer.subscribe([self._topic], listener=Rebalance(self))
        try:
            while not stop.is_set():
                if self._recommit.due():
                    await self.commit()
                if self.held is None:
                    if not self.gate.room():
                        await self._wait_for_room(stop)
                        continue
                    self._resume()
                    self.held = await self._take()
                elif self.gate.admits(self.held.envelope):
                    await self._start_batch(stop)
                else:
                    await self._wait_for_room(stop)
        finally:
            self._resume()
            await self._drain()
            await self._cluster_ids.close()

    async def _take(self, timeout_ms: int = FETCH_TIMEOUT_MS) -> Held | None:
        """The next record, if one comes within the timeout and is a job to run."""
        batches = await self.consumer.getmany(timeout_ms=timeout_ms, max_records=1)
        for tp, records in batches.items():
            for record in records:
                return await self._decode(tp, record)
        return None

    async def _decode(self, tp: TopicPartition, record: FetchedRecord) -> Held | None:
        payload = record.value or b""
        try:
            envelope = DispatchEnvelope.model_validate_json(payload)
        except ValidationError as exc:
            first = exc.errors(include_url=False)[0]
            where = ".".join(str(p) for p in first["loc"])
            reason = f"invalid_envelope: {where + ': ' if where else ''}{first['msg']}"
            await self._dead_letter(tp, record.offset, reason, payload)
            self._skip(tp, record.offset)
            return None
        if any(s.job_id == envelope.job_id for s in self._tasks.values()) or any(
            h.envelope.job_id == envelope.job_id for h, _ in self._batch
        ):
            # A repeated dispatch record (the relay re-sends after an unacknowledged batch)
            # of a job this worker is running: the first record's offset holds the watermark.
            log.info("job %s is already running here; duplicate record skipped", envelope.job_id)
            self._skip(tp, record.offset)
            return None
        return Held(tp, record.offset, envelope)

    async def _dead_letter(
        self, tp: TopicPartition, offset: int, reason: str, payload: bytes
    ) -> None:
        DEAD_LETTERED.labels(source="dispatch", reason=reason.split(":", 1)[0]).inc()
        log.error("record %s@%d dead-lettered: %s", tp, offset, reason)
        await self.executor.set_aside(
            record_subject(tp.topic, tp.partition, offset), reason, payload
        )

    def _skip(self, tp: TopicPartition, offset: int) -> None:
        self._offsets.started(tp, offset)
        self._offsets.finished(tp, offset)

    async def _wait_for_room(self, stop: asyncio.Event) -> None:
        """Pause, and wait for a job to end (or a moment, for remote capacity to move)."""
        self._pause()
        self._changed.clear()
        await wait_first(stop, self._changed, limit_s=RECHECK_S)
        await self._keep_alive()

    async def _keep_alive(self) -> None:
        """Poll with every partition paused: it keeps this member inside
        max.poll.interval.ms however long the jobs run. A partition assigned by a rebalance
        meanwhile is not paused yet; a record it yields is put back (seek), not taken."""
        batches = await self.consumer.getmany(timeout_ms=0, max_records=1)
        for tp, records in batches.items():
            if records:
                self.consumer.seek(tp, records[0].offset)

    async def _start_batch(self, stop: asyncio.Event) -> None:
        """Start the held record and every further one that is ready now and fits (up to
        ``claim_batch``): each reserves its KV need, then the pre-decode gate judges all of
        them in one transaction; the fit ones go to the engine, the dropped ones release
        their reservation and their offsets can commit."""
        while self.held is not None and len(self._batch) < self._claim_batch:
            if not self.gate.admits(self.held.envelope):
                break
            held, self.held = self.held, None
            self._offsets.started(held.tp, held.offset)
            self._batch.append((held, self.gate.started(held.envelope)))
            if len(self._batch) < self._claim_batch and self.gate.room():
                self.held = await self._take(timeout_ms=0)
        ids = [h.envelope.job_id for h, _ in self._batch]
        claimed = self._claimed = asyncio.Event()
        try:
            outcomes = await self.executor.claim(ids, stop)
            batch, self._batch = self._batch, []
            unknown, dropped = self._settle(batch, outcomes)
        finally:
            self._claimed = None
            claimed.set()
        for held in unknown:
            reason = f"unknown_job: no job {held.envelope.job_id}"
            await self._dead_letter(held.tp, held.offset, reason, held.envelope.to_bytes())
        self._changed.set()
        if dropped:
            await self.commit()

    def _settle(
        self,
        batch: list[tuple[Held, Progress]],
        outcomes: dict[str, ClaimedJob | Drop | None] | None,
    ) -> tuple[list[Held], bool]:
        """Start the claimed jobs of ``batch`` and let go of the rest, without an await (a
        revoke that waits for this finds every claimed job running). Returns the records
        of unknown jobs (to dead-letter) and whether any record's offset can commit."""
        unknown: list[Held] = []
        dropped = False
        for held, progress in batch:
            outcome = outcomes.get(held.envelope.job_id) if outcomes is not None else None
            if isinstance(outcome, ClaimedJob):
                self._launch(held, outcome, progress)
                continue
            self.gate.finished(held.envelope.job_id)
            if outcomes is None:  # stopped while the database was down: redelivered later
                continue
            self._offsets.finished(held.tp, held.offset)
            dropped = True
            if isinstance(outcome, Drop):
                DROPPED.labels(reason=outcome.reason).inc()
            else:
                unknown.append(held)
        return unknown, dropped

    def _launch(self, held: Held, job: ClaimedJob, progress: Progress) -> None:
        task = asyncio.create_task(self.executor.run(job, progress), name=f"job-{job.id}")
        self._tasks[task] = Started(held.tp, held.offset, job.id, self._offsets)
        JOBS_RUNNING.set(self.running)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        started = self._tasks.pop(task)
        self.gate.finished(started.job_id)
        JOBS_RUNNING.set(self.running)
        self._changed.set()
        if task.cancelled():
            return  # stopped before a terminal state: leave it for redelivery
        if (exc := task.exception()) is not None:
            log.error("job task failed; its record stays uncommitted", exc_info=exc)
            return
        started.offsets.finished(started.tp, started.offset)
        if started.offsets is self._offsets:  # not a job of a replaced cluster
            asyncio.get_running_loop().create_task(self.commit(), name="commit")

    async def commit(self) -> None:
        async with self._commit_lock:
            offsets = self._offsets
            due = offsets.due()
            if not due:
                self._recommit.done()
                return
            try:
                await self.consumer.commit({tp: offset for tp, offset in due.items()})
            except COMMIT_ERRORS as exc:  # a stale member epoch in a rebalance, an outage
                log.warning("commit failed, again in %.1f s: %r", self._recommit.failed(), exc)
                return
            offsets.committed(due)
            self._recommit.done()

    async def finish_partitions(
        self, partitions: set[TopicPartition], deadline: float | None = None
    ) -> None:
        """Let the jobs of revoked partitions end (bounded: by ``deadline``, else the drain
        timeout from now), commit, then let go of them.

        A claim under way is waited for first: its claimed jobs run, and end like the others.
        A held record of those partitions is dropped: it was never started, and the new
        owner reads it from the committed offset. When the broker's cluster was replaced, the
        jobs running here are not stopped: their records are gone, no owner can be handed
        them, and they run to their end here.
        """
        if deadline is None:
            deadline = asyncio.get_running_loop().time() + self._drain_timeout_s
        await self._claim_settled(deadline)
        if self.held is not None and self.held.tp in partitions:
            self.held = None
        # Records not claimed yet (or a claim past the deadline): the new owner's claim
        # takes over (a new attempt).
        revoked = [held for held, _ in self._batch if held.tp in partitions]
        self._batch = [entry for entry in self._batch if entry[0].tp not in partitions]
        for held in revoked:
            self.gate.finished(held.envelope.job_id)
        if await self._same_cluster() is False:
            return
        await _end(
            [
                t
                for t, s in self._tasks.items()
                if s.tp in partitions and s.offsets is self._offsets
            ],
            deadline,
        )
        if await self._same_cluster():
            await self.commit()
        for tp in partitions:
            self._offsets.forget(tp)

    async def _claim_settled(self, deadline: float) -> None:
        """Wait (until ``deadline``) for the claim under way, if any, to start its jobs."""
        claimed = self._claimed
        if claimed is None:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout_at(deadline):
                await claimed.wait()

    async def _same_cluster(self) -> bool | None:
        """Whether the broker is still the cluster our offsets index: False once its
        cluster id changed (those offsets are dropped, never committed), None when the id
        cannot be read now.

        Apache Kafka keeps its id for life; the embedded in-memory broker gets a new one on
        every start, and committing positions from the old cluster would skip new records.
        """
        try:
            current = await self._cluster_ids.read()
        except (KafkaError, OSError) as exc:
            log.warning("cannot read the cluster id, not committing now: %r", exc)
            return None
        if current == self._cluster:
            return True
        log.error(
            "the broker's cluster id changed (%s -> %s); dropping offsets, %d jobs running here "
            "run to their end",
            self._cluster,
            current,
            self.running,
        )
        self._cluster = current
        self._offsets = OffsetTracker()
        return False

    def assigned(self, partitions: set[TopicPartition]) -> None:
        """Partitions a rebalance assigned start unpaused: paused at once while we wait."""
        if self._paused_since is not None:
            self.consumer.pause(*partitions)

    def _pause(self) -> None:
        if self._paused_since is None:
            self.consumer.pause(*self.consumer.assignment())
            self._paused_since = time.monotonic()

    def _resume(self) -> None:
        if self._paused_since is not None:
            self.consumer.resume(*self.consumer.assignment())
            self._count_paused()

    def _count_paused(self) -> None:
        if self._paused_since is not None:
            PAUSED_SECONDS.inc(time.monotonic() - self._paused_since)
            self._paused_since = None

    async def _drain(self) -> None:
        """At stop: every job running here ends, or is aborted, within the drain timeout."""
        deadline = asyncio.get_running_loop().time() + self._drain_timeout_s
        log.info(
            "stopping: no more records taken; draining %d jobs for at most %.0f s",
            len(self._tasks),
            self._drain_timeout_s,
        )
        with contextlib.suppress(*COMMIT_ERRORS):
            await self.finish_partitions({s.tp for s in self._tasks.values()}, deadline)
        await _end(list(self._tasks), deadline)  # those of a replaced cluster, left by a revoke


async def _end(tasks: list[asyncio.Task[None]], deadline: float) -> None:
    """Wait for ``tasks`` until ``deadline``, then cancel the rest (left for redelivery)."""
    if not tasks:
        return
    timeout = max(deadline - asyncio.get_running_loop().time(), 0.0)
    _, pending = await asyncio.wait(tasks, timeout=timeout)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
