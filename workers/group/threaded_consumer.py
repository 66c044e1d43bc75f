"""The worker's consumer on Kafka's consumer group protocol (KIP-848), through
confluent-kafka (librdkafka), served by a thread of its own: the broker computes the
assignment, and a member joining or leaving revokes only the partitions that move, while the
others go on consuming.

It offers the worker the calls it makes of aiokafka's consumer (``GroupConsumer`` of
``workers.group.seams``: subscribe with a rebalance listener, ``getmany``,
``pause``/``resume``, ``seek``, ``commit``, ``assignment``, ``start``/``stop``), so the
KV-gated pull, the manual commits and the drain of revoked partitions are the same code on
either protocol.

librdkafka's consumer admits one call at a time, and its rebalance callbacks run inside
``poll``. So one thread owns it: the event loop queues calls to that thread, which polls
in short slices and runs queued calls between them. A revoke's callback runs the worker's
listener (its drain) on the event loop and waits for it, running the calls that drain
queues (its commit) meanwhile, in the same thread: the partitions are acknowledged to the
broker as revoked only once their jobs ended or were handed over.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, NamedTuple

from aiokafka import TopicPartition
from confluent_kafka import Consumer, KafkaError, KafkaException, Message
from confluent_kafka import TopicPartition as Partition

from plumbing.kafka import broker_api_keys
from workers.group.seams import RebalanceListener

log = logging.getLogger(__name__)

# How long one poll blocks before queued calls (commits, pauses) get their turn.
POLL_SLICE_S = 0.02
# Records librdkafka prefetches per partition at most (it takes 100,000 by default); the
# worker takes one at a time, and only when its engine can start the job.
QUEUED_MIN_MESSAGES = 16
# librdkafka's floor for ``fetch.max.bytes`` (its ``message.max.bytes``).
MESSAGE_MAX_BYTES = 1_000_000


# ConsumerGroupHeartbeat, the consumer protocol's one request (Kafka 4.0 and later).
CONSUMER_GROUP_HEARTBEAT = 68


class ProtocolUnsupported(Exception):
    """The broker has no consumer group protocol: the worker must run the classic one."""


async def require_consumer_protocol(bootstrap: str) -> None:
    """librdkafka against a broker without KIP-848 waits for an assignment in silence; a
    worker asks the broker first, and says what to do."""
    if CONSUMER_GROUP_HEARTBEAT not in await broker_api_keys(bootstrap):
        raise ProtocolUnsupported(
            f"the broker at {bootstrap} has no consumer group protocol (KIP-848, Apache Kafka "
            "4.0 and later): set SLUICEGATE_WORKER_GROUP_PROTOCOL=classic"
        )


class Record(NamedTuple):
    """A fetched record, as the worker reads it."""

    offset: int
    value: bytes | None


@dataclass
class _Call:
    fn: Callable[[Consumer], Any]
    future: concurrent.futures.Future[Any]
    nested: bool  # may run inside a poll (between slices, or while a callback waits)


def consumer_config(
    bootstrap: str, *, group_id: str, fetch_bytes: int, group_instance_id: str | None
) -> dict[str, Any]:
    """Manual commits of what ended; a fetch bounded as the classic worker's is. The
    session timeout and heartbeat interval are the broker's under this protocol
    (``group.consumer.*``)."""
    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "group.id": group_id,
        "group.protocol": "consumer",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "max.partition.fetch.bytes": fetch_bytes,
        "fetch.max.bytes": max(10 * fetch_bytes, MESSAGE_MAX_BYTES),
        "queued.min.messages": QUEUED_MIN_MESSAGES,
        "queued.max.messages.kbytes": max(fetch_bytes // 1024, 1),
        "topic.metadata.refresh.interval.ms": 5_000,
        "logger": log,
    }
    if group_instance_id is not None:
        config["group.instance.id"] = group_instance_id
    return config


class ThreadedConsumer:
    """A worker's member of its group under ``group.protocol=consumer``."""

    def __init__(self, config: dict[str, Any]) -> None:
        self._config = config
        self._calls: deque[_Call] = deque()
        self._ready = threading.Condition()
        self._thread = threading.Thread(target=self._serve, name="kafka-consumer", daemon=True)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._listener: RebalanceListener | None = None
        self._topics: list[str] = []
        self._assigned: frozenset[TopicPartition] = frozenset()
        self._consumer: Consumer | None = None
        self._closed = False
        self._ended: BaseException | None = None  # once set, every call fails with it
        self.member_id: str | None = None

    # The loop's side.

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread.start()
        await self.call(lambda consumer: None)  # made, in its thread

    def subscribe(self, topics: list[str], listener: RebalanceListener) -> None:
        self._listener = listener
        self._topics = topics
        self._post(self._subscribe)

    async def getmany(
        self, timeout_ms: int = 0, max_records: int = 1
    ) -> dict[TopicPartition, list[Record]]:
        """At most one record (the worker takes one at a time), waiting up to the timeout."""
        message = await self.call(lambda c: self._poll(c, timeout_ms / 1000), nested=False)
        if message is None:
            return {}
        tp = TopicPartition(message.topic(), message.partition())
        return {tp: [Record(message.offset(), message.value())]}

    def pause(self, *partitions: TopicPartition) -> None:
        if partitions:
            self._post(lambda c: c.pause([Partition(tp.topic, tp.partition) for tp in partitions]))

    def resume(self, *partitions: TopicPartition) -> None:
        if partitions:
            self._post(lambda c: c.resume([Partition(tp.topic, tp.partition) for tp in partitions]))

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self._post(lambda c: c.seek(Partition(tp.topic, tp.partition, offset)))

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        parts = [Partition(tp.topic, tp.partition, offset) for tp, offset in offsets.items()]
        await self.call(lambda c: c.commit(offsets=parts, asynchronous=False))

    def assignment(self) -> set[TopicPartition]:
        return set(self._assigned)

    async def stop(self) -> None:
        """Leave the group (a revoke of what it holds first), then end the thread."""
        if not self._thread.is_alive():
            return
        if not self._closed:
            try:
                await self.call(self._close, nested=False)
            except (KafkaException, RuntimeError) as exc:  # RuntimeError: its handle is gone
                log.warning("closing the consumer: %r", exc)
        await self.call(_END, nested=False)
        await asyncio.to_thread(self._thread.join)

    async def call(self, fn: Callable[[Consumer], Any], *, nested: bool = True) -> Any:
        """Run ``fn`` with the consumer in its thread; its result."""
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._queue(_Call(fn, future, nested))
        return await asyncio.wrap_future(future)

    def _post(self, fn: Callable[[Consumer], Any]) -> None:
        """Queue ``fn`` without waiting; an error is logged."""
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        future.add_done_callback(_log_failure)
        self._queue(_Call(fn, future, nested=True))

    def _queue(self, call: _Call) -> None:
        with self._ready:
            if self._ended is None:
                self._calls.append(call)
                self._ready.notify()
                return
        call.future.set_exception(self._ended)

    # The consumer's thread.

    def _serve(self) -> None:
        try:
            self._consumer = Consumer(self._config)
        except KafkaException as exc:
            self._fail_all(exc)
            return
        while True:
            with self._ready:
                while not self._calls:
                    self._ready.wait()
                call = self._calls.popleft()
            if call.fn is _END:
                call.future.set_result(None)
                self._fail_all(RuntimeError("the consumer is stopped"))
                return
            _run(call, self._consumer)

    def _run_nested(self, consumer: Consumer) -> None:
        """Run the queued calls that may run inside a poll, in order (a fetch or the stop
        waits for the poll under way to end)."""
        while True:
            with self._ready:
                call = next((c for c in self._calls if c.nested), None)
                if call is None:
                    return
                self._calls.remove(call)
            _run(call, consumer)

    def _poll(self, consumer: Consumer, timeout_s: float) -> Message | None:
        deadline = time.monotonic() + timeout_s
        while True:
            message = consumer.poll(min(POLL_SLICE_S, max(deadline - time.monotonic(), 0.0)))
            if message is not None:
                error = message.error()
                if error is None:
                    return message
                if error.code() == KafkaError._FATAL:
                    self._renew(consumer, error)
                    return None
                if error.code() != KafkaError._PARTITION_EOF:
                    log.warning("consumer: %s", error)
            self._run_nested(consumer)
            if time.monotonic() >= deadline:
                return None

    def _subscribe(self, consumer: Consumer) -> None:
        consumer.subscribe(
            self._topics,
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )

    def _renew(self, consumer: Consumer, error: KafkaError) -> None:
        """After a fatal error (the group gone from the broker, a fenced static member) a
        librdkafka consumer is done for: what it held is handed back as lost, and a new one
        joins the group in its place."""
        log.error("the consumer's error is fatal (%s): a new one joins in its place", error)
        self._on_lost(consumer, [Partition(tp.topic, tp.partition) for tp in self._assigned])
        try:
            consumer.close()
        except (KafkaException, RuntimeError) as exc:
            log.warning("closing the failed consumer: %r", exc)
        self.member_id = None
        self._consumer = Consumer(self._config)
        self._subscribe(self._consumer)

    def _close(self, consumer: Consumer) -> None:
        self._closed = True
        consumer.close()

    def _on_assign(self, consumer: Consumer, partitions: list[Partition]) -> None:
        if self.member_id is None:
            self.member_id = consumer.memberid()
            log.info("joined group %s as member %s", self._config["group.id"], self.member_id)
        consumer.incremental_assign(partitions)  # before the listener: it may pause them
        tps = {TopicPartition(p.topic, p.partition) for p in partitions}
        self._assigned = self._assigned | tps
        if tps and self._listener is not None:
            self._wait(consumer, self._listener.on_partitions_assigned(tps))

    def _on_revoke(self, consumer: Consumer, partitions: list[Partition]) -> None:
        tps = {TopicPartition(p.topic, p.partition) for p in partitions}
        if tps and self._listener is not None:
            self._wait(consumer, self._listener.on_partitions_revoked(tps))
        self._assigned = self._assigned - tps
        try:
            consumer.incremental_unassign(partitions)
        except KafkaException as exc:  # a consumer that failed: it is being replaced
            log.warning("unassigning revoked partitions: %r", exc)

    def _on_lost(self, consumer: Consumer, partitions: list[Partition]) -> None:
        log.warning("lost %d partitions (no longer this member's)", len(partitions))
        self._on_revoke(consumer, partitions)

    def _wait(self, consumer: Consumer, coro: Coroutine[Any, Any, None]) -> None:
        """Run the listener's ``coro`` on the event loop until it ends, serving the calls
        it queues here meanwhile."""
        assert self._loop is not None
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        while not future.done():
            self._run_nested(consumer)
            with self._ready:
                if not any(c.nested for c in self._calls):
                    self._ready.wait(POLL_SLICE_S)
        if (exc := future.exception()) is not None:
            log.error("the rebalance listener failed", exc_info=exc)

    def _fail_all(self, exc: BaseException) -> None:
        with self._ready:
            self._ended = exc
            calls, self._calls = list(self._calls), deque()
        for call in calls:
            call.future.set_exception(exc)


def _END(consumer: Consumer) -> None:  # a marker call: ends the thread
    return None


def _run(call: _Call, consumer: Consumer) -> None:
    if not call.future.set_running_or_notify_cancel():
        return
    try:
        call.future.set_result(call.fn(consumer))
    except BaseException as exc:  # handed to the caller
        call.future.set_exception(exc)


def _log_failure(future: concurrent.futures.Future[Any]) -> None:
    if not future.cancelled() and (exc := future.exception()) is not None:
        log.warning("consumer call failed: %r", exc)
