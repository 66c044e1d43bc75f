"""The brokers of the tests: Apache Kafka from the jars `sluicegate kafka pull` put in place
(the default), and Tansu for the tests of the fallback.

Nothing here downloads. A machine without the pulled broker fails the tests that need it
with the command that fetches it, rather than skipping them: CI runs `sluicegate kafka pull`
before pytest. SLUICEGATE_TEST_BROKER=tansu runs the whole suite on Tansu instead.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from plumbing.settings import Settings
from sluicegate.local.broker import dist
from sluicegate.local.broker.apache import ApacheKafka
from sluicegate.local.broker.base import BrokerProcess
from sluicegate.local.broker.tansu import WORKAROUNDS, TansuBroker

# The tests' brokers are small: a session's and a few of a test's own run at once.
HEAP_MB = 512


def default_kind() -> str:
    """The broker the suite runs on: SLUICEGATE_TEST_BROKER (kafka or tansu), else kafka."""
    kind = os.environ.get("SLUICEGATE_TEST_BROKER", "kafka")
    if kind not in ("kafka", "tansu"):
        pytest.fail(f"SLUICEGATE_TEST_BROKER must be kafka or tansu, not {kind!r}", pytrace=False)
    return kind


def kafka_home() -> Path:
    """The pulled broker: SLUICEGATE_TEST_KAFKA_HOME if set, else the default data
    directory's, where `sluicegate kafka pull` puts it."""
    if explicit := os.environ.get("SLUICEGATE_TEST_KAFKA_HOME"):
        home = Path(explicit)
    else:
        home = dist.kafka_home(Settings().data_dir)
    if not dist.is_pulled(home):
        pytest.fail(
            f"no Apache Kafka {dist.KAFKA_VERSION} at {home}: run `sluicegate kafka pull` "
            "first (or SLUICEGATE_TEST_BROKER=tansu for the fallback broker)",
            pytrace=False,
        )
    return home


def apache_kafka(root: Path) -> ApacheKafka:
    """An Apache Kafka broker with its log and files in ``root`` (not started)."""
    try:
        java = dist.find_java(java_home=os.environ.get("JAVA_HOME"))
    except dist.KafkaUnavailable as exc:
        pytest.fail(f"Apache Kafka cannot run here ({exc.code}): {exc}", pytrace=False)
    root.mkdir(parents=True, exist_ok=True)
    return ApacheKafka(
        root=root, home=kafka_home(), java=java, heap_mb=HEAP_MB, log_path=root / "broker.log"
    )


def tansu(root: Path) -> TansuBroker:
    root.mkdir(parents=True, exist_ok=True)
    return TansuBroker(log_path=root / "broker.log")


def make(kind: str, root: Path) -> ApacheKafka | TansuBroker:
    return apache_kafka(root) if kind == "kafka" else tansu(root)


def on_broker(settings: Settings, broker: BrokerProcess) -> Settings:
    """``settings`` pointed at ``broker``, with the Tansu workarounds where it is Tansu."""
    update: dict[str, object] = {"kafka_bootstrap_servers": broker.bootstrap}
    if isinstance(broker, TansuBroker):
        update.update(tansu_settings())
    else:
        update.update(
            kafka_idempotent_producer=True,
            kafka_exact_end_offsets=True,
        )
    return settings.model_copy(update=update)


def tansu_settings() -> dict[str, Any]:
    """The Tansu workarounds as settings fields (``WORKAROUNDS`` names the variables)."""
    values: dict[str, Any] = {}
    for name, value in WORKAROUNDS.items():
        values[name.lower()] = {"true": True, "false": False}.get(value, value)
    return values


async def restart_on_a_lost_log(broker: ApacheKafka | TansuBroker) -> None:
    """Start the broker again on an empty log with a new cluster id: Tansu always does;
    Apache Kafka as it would after losing its disk."""
    if isinstance(broker, ApacheKafka):
        await broker.restart(lose_log=True)
    else:
        await broker.restart()
