"""Real services for every integration test.

Each service comes from, in order: an explicit URL in the environment, testcontainers when a
Docker engine answers, else the embedded stack (PostgreSQL, and Apache Kafka from the pulled
jars, or Tansu with SLUICEGATE_TEST_BROKER=tansu). Every test gets its own database (a clone
of a migrated template), its own topics (deleted after it) and its own consumer group.
"""

from __future__ import annotations

import functools
import os
import shutil
import socket
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from plumbing.db import libpq_url, make_engine
from plumbing.kafka import delete_topics, ensure_topics
from plumbing.settings import Settings
from sluicegate import migrate
from sluicegate.local.broker.apache import ApacheKafka
from sluicegate.local.broker.tansu import TansuBroker
from sluicegate.local.embedded import EmbeddedPostgres
from tests.support import brokers, containers


@functools.cache
def _docker_answers() -> bool:
    """Whether a Docker engine answers /_ping on its socket (testcontainers needs one)."""
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if not host.startswith("unix://"):
        return True  # a remote engine was configured explicitly: let testcontainers try
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(2)
            sock.connect(host.removeprefix("unix://"))
            sock.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
            return b" 200 " in sock.recv(64)
    except OSError:
        return False


def _with_database(url: str, name: str) -> str:
    return make_url(url).set(database=name).render_as_string(hide_password=False)


@pytest.fixture(scope="session")
def pg_admin_url() -> Iterator[str]:
    """A plain postgresql:// URL to a maintenance database of a real server."""
    if url := os.environ.get("SLUICEGATE_TEST_DATABASE_URL"):
        yield libpq_url(url)
    elif _docker_answers():
        with containers.postgres() as url:
            yield libpq_url(url)
    else:
        # Not under pytest's basetemp: every pytest session that starts resets that root to
        # mode 0700, which (as root, where the server runs as its own user) would cut a
        # server of another session still running off its data directory.
        data_dir = Path(tempfile.mkdtemp(prefix="sluicegate-test-postgres-"))
        server = EmbeddedPostgres(data_dir)
        server.start()
        try:
            yield server.admin_url
        finally:
            server.stop()
            shutil.rmtree(data_dir, ignore_errors=True)


@pytest.fixture(scope="session")
async def template_database(pg_admin_url: str) -> AsyncIterator[str]:
    """A database migrated to head, cloned for every test."""
    name = f"sluicegate_template_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(pg_admin_url)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        await migrate.upgrade_async(_with_database(pg_admin_url, name))
        yield name
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


@pytest.fixture
async def database_url(pg_admin_url: str, template_database: str) -> AsyncIterator[str]:
    name = f"test_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(pg_admin_url)
    try:
        await admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_database}"')
        yield _with_database(pg_admin_url, name)
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


@pytest.fixture(scope="session")
def kafka_is_tansu() -> bool:
    if os.environ.get("SLUICEGATE_TEST_KAFKA_BOOTSTRAP"):
        return os.environ.get("SLUICEGATE_TEST_KAFKA_IS_TANSU") == "1"
    return not _docker_answers() and brokers.default_kind() == "tansu"


@pytest.fixture(scope="session")
async def kafka_bootstrap(
    kafka_is_tansu: bool, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[str]:
    if bootstrap := os.environ.get("SLUICEGATE_TEST_KAFKA_BOOTSTRAP"):
        yield bootstrap
    elif _docker_answers():
        with containers.kafka() as bootstrap:
            yield bootstrap
    else:
        root = tmp_path_factory.mktemp("broker")
        broker = brokers.make("tansu" if kafka_is_tansu else "kafka", root)
        await broker.start()
        try:
            yield broker.bootstrap
        finally:
            broker.stop()


@pytest.fixture(scope="session")
async def tansu_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[str]:
    """A Tansu broker for the session's tests of the fallback (started when one asks)."""
    broker = brokers.tansu(tmp_path_factory.mktemp("tansu"))
    await broker.start()
    try:
        yield broker.bootstrap
    finally:
        broker.stop()


@pytest.fixture
def topic_prefix() -> str:
    return f"t{uuid.uuid4().hex[:10]}"


@pytest.fixture
async def settings(
    database_url: str,
    kafka_bootstrap: str,
    kafka_is_tansu: bool,
    topic_prefix: str,
    tmp_path: Path,
) -> AsyncIterator[Settings]:
    s = Settings(
        database_url=database_url,
        kafka_bootstrap_servers=kafka_bootstrap,
        dispatch_topic=f"{topic_prefix}.dispatch",
        events_topic=f"{topic_prefix}.events",
        dead_letter_topic=f"{topic_prefix}.deadletter",
        consumer_group=f"{topic_prefix}-workers",
        partitions=4,
        data_dir=tmp_path,
        # The features under test, not authentication: the tenant comes from the header.
        # tests/integration/test_tenancy.py runs the API with keys.
        auth="tenant_header",
        **(brokers.tansu_settings() if kafka_is_tansu else {}),
    )
    await ensure_topics(kafka_bootstrap, s.topic_partitions())
    yield s
    # Many hundred tests share a broker: each takes its topics with it.
    await delete_topics(kafka_bootstrap, list(s.topic_partitions()))


@pytest.fixture
async def tansu_settings(settings: Settings, tansu_bootstrap: str) -> AsyncIterator[Settings]:
    """The test's settings on the session's Tansu broker, with the fallback's workarounds."""
    s = settings.model_copy(
        update={"kafka_bootstrap_servers": tansu_bootstrap, **brokers.tansu_settings()}
    )
    await ensure_topics(tansu_bootstrap, s.topic_partitions())
    yield s
    await delete_topics(tansu_bootstrap, list(s.topic_partitions()))


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[ApacheKafka]:
    """An Apache Kafka broker of the test's own, to kill and restart (on its log)."""
    own = brokers.apache_kafka(tmp_path / "kafka")
    await own.start()
    try:
        yield own
    finally:
        own.stop()


@pytest.fixture(params=["kafka", "tansu"])
async def lossy_broker(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[ApacheKafka | TansuBroker]:
    """A broker of the test's own that will lose its log (``brokers.restart_on_a_lost_log``):
    Apache Kafka, whose disk is lost, and Tansu, which loses it at every restart."""
    own = brokers.make(request.param, tmp_path / request.param)
    await own.start()
    try:
        yield own
    finally:
        own.stop()


@pytest.fixture
async def db(settings: Settings) -> AsyncIterator[AsyncEngine]:
    """An engine on the test's database, for reading what the pipeline wrote."""
    engine = make_engine(settings.require_database_url(), pool_size=4)
    yield engine
    await engine.dispose()
