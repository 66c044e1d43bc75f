"""What shipped code uses of another library beyond its public API, held to the installed
version: a test here fails loudly when such an internal moves, before anything else does.

aiokafka (pinned below its next minor in pyproject.toml): it has no public way to give up
on an idempotent producer's records (its ``stop()`` waits for every one, with no timeout,
and the producer never expires them), so ``plumbing.kafka._abandon`` cancels the producer's
sender task and fails what its accumulator holds; and it has no public generation of a
classic group, which ``workers.group.listener`` reads from the consumer's coordinator for
``sluicegate_worker_group_generation``.

``tests/layout/test_survey.py`` lets shipped code read another library's private attribute
only when a test here reads it too.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.consumer.group_coordinator import GroupCoordinator
from aiokafka.errors import KafkaTimeoutError

from plumbing.kafka import make_producer


@pytest.fixture
async def producer() -> AsyncIterator[AIOKafkaProducer]:
    # Never started: no broker is needed for its parts to be there.
    producer = make_producer("localhost:1", idempotent=True)
    yield producer
    await producer.stop()


async def test_the_producer_has_a_sender_with_its_task(producer: AIOKafkaProducer) -> None:
    sender = producer._sender
    assert isinstance(inspect.getattr_static(type(sender), "sender_task"), property)
    assert sender.sender_task is None  # until the producer starts


async def test_the_accumulator_fails_every_record_it_holds(producer: AIOKafkaProducer) -> None:
    accumulator = producer._message_accumulator
    assert list(inspect.signature(accumulator.fail_all).parameters) == ["exception"]
    delivered = await accumulator.add_message(TopicPartition("t", 0), b"k", b"v", timeout=1.0)
    error = KafkaTimeoutError("given up")
    accumulator.fail_all(error)
    with pytest.raises(KafkaTimeoutError):
        await asyncio.wait_for(delivered, 1.0)


async def test_a_started_consumer_keeps_its_group_coordinator_with_its_generation() -> None:
    # Made by start(), which needs a broker: the source says where it is kept.
    started = inspect.getsource(AIOKafkaConsumer.start)
    assert "self._coordinator = " in started
    assert "self.generation = " in inspect.getsource(GroupCoordinator.__init__)
    consumer = AIOKafkaConsumer(bootstrap_servers="localhost:1")
    try:
        assert consumer._coordinator is None  # the attribute the listener reads, until start()
    finally:
        await consumer.stop()
