"""The worker's consumer loop: pull only what the engine can start, commit the watermark."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.errors import KafkaError
from pydantic import ValidationError

from schemas.envelopes import DispatchEnvelope
from sluicegate.aio import wait_first
from sluicegate.kafka import cluster_id
from workers.engines.base import InferenceEngine
from workers.execution import Executor
from workers.metrics import DEAD_LETTERED, JOBS_RUNNING
from workers.offsets import OffsetTracker

log = logging.getLogger(__name__)

FETCH_TIMEOUT_MS = 500


class Worker:
    """One member of the worker consumer group.

    It asks the broker for at most as many records as the engine can start now, pauses its
    partitions while it is full, and commits each partition only up to the lowest offset
    whose job is not yet terminal.
    """

    def __init__(
        self,
        *,
        consumer: AIOKafkaConsumer,
        engine: InferenceEngine,
        executor: Executor,
        topic: str,
        bootstrap: str,
        drain_timeout_s: float,
    ) -> None:
        self._consumer = consumer
        self._engine = engine
        self._executor = executor
        self._topic = topic
        self._bootstrap = bootstrap
        self._cluster: str | None = None
        self._drain_timeout_s = drain_timeout_s
        self._offsets: OffsetTracker[TopicPartition] = OffsetTracker()
        self._tasks: dict[asyncio.Task[None], TopicPartition] = {}
        self._jobs: dict[asyncio.Task[None], str] = {}
        self._changed = asyncio.Event()
        self._commit_lock = asyncio.Lock()
        self._paused = False

    @property
    def running(self) -> int:
        return len(self._tasks)

    async def run(self, stop: asyncio.Event) -> None:
        self._cluster = await cluster_id(self._bootstrap)
        self._consumer.subscribe([self._topic], listener=_Rebalance(self))
        try:
            while not stop.is_set():
                free = self._engine.capacity().total_slots - self.running
                if free <= 0:
                    self._pause()
                    self._changed.clear()
                    await wait_first(stop, self._changed)
                    continue
                self._resume()
                batches = await self._consumer.getmany(
                    timeout_ms=FETCH_TIMEOUT_MS, max_records=free
                )
                for tp, records in batches.items():
                    for record in records:
                        self._start(tp, record)
        finally:
            await self._drain()

    def _start(self, tp: TopicPartition, record: ConsumerRecord[bytes, bytes]) -> None:
        self._offsets.started(tp, record.offset)
        try:
            envelope = DispatchEnvelope.model_validate_json(record.value or b"")
        except ValidationError as exc:
            DEAD_LETTERED.labels(reason="invalid_envelope").inc()
            log.error("undecodable record %s@%d skipped: %s", tp, record.offset, exc)
            self._offsets.finished(tp, record.offset)
            return
        if envelope.job_id in self._jobs.values():
            # A repeated dispatch record (the relay re-sends after an unacknowledged batch)
            # of a job this worker is running: the first record's offset holds the watermark.
            log.info("job %s is already running here; duplicate record skipped", envelope.job_id)
            self._offsets.finished(tp, record.offset)
            return
        task = asyncio.create_task(self._executor.run(envelope), name=f"job-{envelope.job_id}")
        self._tasks[task] = tp
        self._jobs[task] = envelope.job_id
        JOBS_RUNNING.set(self.running)
        task.add_done_callback(lambda t: self._done(t, record.offset))

    def _done(self, task: asyncio.Task[None], offset: int) -> None:
        tp = self._tasks.pop(task)
        self._jobs.pop(task, None)
        JOBS_RUNNING.set(self.running)
        self._changed.set()
        if task.cancelled():
            return  # stopped before a terminal state: leave it for redelivery
        if (exc := task.exception()) is not None:
            log.error("job task failed; its record stays uncommitted", exc_info=exc)
            return
        self._offsets.finished(tp, offset)
        asyncio.get_running_loop().create_task(self.commit(), name="commit")

    async def commit(self) -> None:
        async with self._commit_lock:
            due = self._offsets.due()
            if not due:
                return
            try:
                await self._consumer.commit({tp: offset for tp, offset in due.items()})
            except KafkaError as exc:
                log.warning("commit failed, will retry with the next one: %r", exc)
                return
            self._offsets.committed(due)

    async def finish_partitions(self, partitions: set[TopicPartition]) -> None:
        """Let the jobs of revoked partitions end (bounded), commit, then let go of them."""
        tasks = [t for t, tp in self._tasks.items() if tp in partitions]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=self._drain_timeout_s)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        if await self._same_log():
            await self.commit()
        for tp in partitions:
            self._offsets.forget(tp)

    async def _same_log(self) -> bool:
        """False when the broker's cluster id changed: the log our offsets index is gone.

        Apache Kafka keeps its id for life; the embedded in-memory broker gets a new one on
        every start, and committing positions from the lost log would skip new records.
        """
        try:
            current = await cluster_id(self._bootstrap)
        except (KafkaError, OSError) as exc:
            log.warning("cannot read the cluster id, not committing now: %r", exc)
            return False
        if current == self._cluster:
            return True
        log.error(
            "the broker's log was replaced (%s -> %s); dropping offsets", self._cluster, current
        )
        self._cluster = current
        self._offsets = OffsetTracker()
        return False

    def assigned(self) -> None:
        """A new assignment starts unpaused (positions come from the committed offsets);
        the loop pauses again if it must."""
        self._paused = False

    def _pause(self) -> None:
        if not self._paused:
            self._consumer.pause(*self._consumer.assignment())
            self._paused = True

    def _resume(self) -> None:
        if self._paused:
            self._consumer.resume(*self._consumer.assignment())
            self._paused = False

    async def _drain(self) -> None:
        with contextlib.suppress(KafkaError):
            await self.finish_partitions(set(self._tasks.values()))


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, worker: Worker) -> None:
        self._worker = worker

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self._worker.finish_partitions(set(revoked))

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self._worker.assigned()
