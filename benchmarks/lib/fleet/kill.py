"""A member of the consumer protocol killed as SIGKILL would: librdkafka's handle destroyed
without its consumer close, so no leave heartbeat is sent, nothing is committed, and the
broker keeps its partitions until the session times out (``group.consumer.session.
timeout.ms``).

confluent-kafka has no call for it, so it is made through librdkafka's own
``rd_kafka_destroy_flags(rk, RD_KAFKA_DESTROY_F_NO_CONSUMER_CLOSE)`` on the handle the
binding holds (the first field after the object header of its ``Handle``), which is then
cleared so the binding's later calls answer "Consumer closed". Run in the consumer's own
thread, between polls: never while librdkafka is inside a call."""

from __future__ import annotations

import ctypes
from functools import cache
from pathlib import Path

import confluent_kafka
from confluent_kafka import Consumer

NO_CONSUMER_CLOSE = 0x8
# PyObject_HEAD: a reference count and a type pointer.
HANDLE_OFFSET = ctypes.sizeof(ctypes.c_ssize_t) + ctypes.sizeof(ctypes.c_void_p)


@cache
def librdkafka() -> ctypes.CDLL:
    package = Path(confluent_kafka.__file__).parent
    found = sorted((package.parent / "confluent_kafka.libs").glob("librdkafka*.so*"))
    lib = ctypes.CDLL(str(found[0])) if found else ctypes.CDLL("librdkafka.so.1")
    lib.rd_kafka_destroy_flags.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.rd_kafka_destroy_flags.restype = None
    lib.rd_kafka_name.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_name.restype = ctypes.c_char_p
    return lib


def handle_name(consumer: Consumer) -> str | None:
    """librdkafka's name of the handle the binding holds (checks the offset)."""
    rk = ctypes.c_void_p.from_address(id(consumer) + HANDLE_OFFSET).value
    if rk is None:
        return None
    name = librdkafka().rd_kafka_name(rk)
    return name.decode() if name else None


def destroy_without_leaving(consumer: Consumer) -> None:
    slot = ctypes.c_void_p.from_address(id(consumer) + HANDLE_OFFSET)
    if slot.value is None:
        return
    name = librdkafka().rd_kafka_name(slot.value)
    if not name or not name.startswith(b"rdkafka#consumer"):
        raise RuntimeError("not a librdkafka consumer handle: the binding's layout changed")
    librdkafka().rd_kafka_destroy_flags(slot.value, NO_CONSUMER_CLOSE)
    slot.value = None
