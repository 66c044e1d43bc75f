"""The services as containers, where a Docker engine answers (none does on this project's
machines, so this path is not run in CI): PostgreSQL, and Apache Kafka from the image of the
version the embedded broker runs, with the same broker settings."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sluicegate.local.broker.apache import SHARED_SETTINGS, new_cluster_id
from sluicegate.local.broker.dist import KAFKA_VERSION
from sluicegate.local.embedded import free_port

KAFKA_IMAGE = f"apache/kafka:{KAFKA_VERSION}"


@contextmanager
def postgres() -> Iterator[str]:
    """A SQLAlchemy URL of a PostgreSQL 16 container."""
    from testcontainers.community.postgres import PostgresContainer

    with PostgresContainer("postgres:16", driver=None) as container:
        yield container.get_connection_url()


@contextmanager
def kafka() -> Iterator[str]:
    """The bootstrap address of an Apache Kafka container, published on the same free port
    inside and out, so that the address it advertises is the one a client dials."""
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.wait_strategies import LogMessageWaitStrategy

    port = free_port()
    container = DockerContainer(KAFKA_IMAGE).with_bind_ports(port, port)
    for key, value in SHARED_SETTINGS.items():
        container = container.with_env("KAFKA_" + key.upper().replace(".", "_"), value)
    settings = {
        "CLUSTER_ID": new_cluster_id(),
        "KAFKA_LISTENERS": f"PLAINTEXT://:{port},CONTROLLER://:9093",
        "KAFKA_ADVERTISED_LISTENERS": f"PLAINTEXT://localhost:{port}",
        "KAFKA_CONTROLLER_QUORUM_VOTERS": "1@localhost:9093",
    }
    for key, value in settings.items():
        container = container.with_env(key, value)
    with container.waiting_for(LogMessageWaitStrategy("Kafka Server started")):
        yield f"localhost:{port}"
