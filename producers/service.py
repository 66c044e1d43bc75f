"""Entry points of the ingress processes: the API and the outbox relay."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
from dataclasses import replace

import uvicorn
from fastapi import FastAPI

from plumbing.db import make_engine
from plumbing.logs import uvicorn_log_config
from plumbing.metrics import serve as serve_metrics
from plumbing.pools import Pools
from plumbing.settings import Settings
from producers.api import channel
from producers.api.app import create_app
from producers.api.server import ApiServer, exit_cleanly, serve_processes
from producers.outbox.config import OutboxConfig
from producers.outbox.reconciler import Reconciler
from producers.outbox.relay import OutboxRelay
from producers.outbox.repository import OutboxStore
from producers.outbox.topic_view import TopicViewReader
from producers.retention.pruner import Pruner
from producers.retention.repository import RetentionStore

log = logging.getLogger(__name__)


def app_from_env() -> FastAPI:
    """Factory for ``uvicorn --factory`` with several API processes."""
    return gc_frozen(create_app(Settings()))


def gc_frozen(app: FastAPI) -> FastAPI:
    """``app``, every object made so far (modules, classes, models, the app and its routes:
    they live as long as the process) left out of the garbage collector's passes from now
    on. Its full passes over them were a large share of the API's CPU under load
    (docs/performance.md). A frozen object that dies is still freed by its reference
    count; only a cycle among them would stay."""
    gc.collect()
    gc.freeze()
    return app


def serve_api(settings: Settings, *, processes: int = 1) -> None:
    """Serve the API, in ``processes`` processes on one socket. On SIGTERM the submit
    channels answer what they read, then in-flight requests are answered; those still open
    after ``api_shutdown_timeout_s`` are cut (long-polls and ?wait= submits hold theirs).

    After its drain, uvicorn gives the signal back to the handler it found; the default one
    would kill the drained process (exit -15), so ours exits 0.
    """
    # Said before uvicorn starts: from inside its lifespan, a missing setting is a traceback.
    settings.require_database_url()
    settings.require_kafka()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, exit_cleanly)
    app: FastAPI | str = "producers.service:app_from_env"
    if processes == 1:
        app = gc_frozen(create_app(settings))
    config = uvicorn.Config(
        app,
        factory=processes > 1,
        host=settings.api_host,
        port=settings.api_port,
        log_level=settings.log_level.lower(),
        log_config=uvicorn_log_config(),
        limit_concurrency=settings.api_max_connections,
        timeout_graceful_shutdown=settings.api_shutdown_timeout_s,
        ws_max_size=2 * settings.api.max_body_bytes + channel.FRAME_OVERHEAD,
    )
    if processes == 1:
        ApiServer(config).run()
        return
    status = serve_processes(config, processes)
    if status:
        raise SystemExit(status)


async def run_relay(settings: Settings, stop: asyncio.Event) -> None:
    serve_metrics("relay", settings.metrics_port)
    db = make_engine(settings.require_database_url(), pool_size=2)
    try:
        config = OutboxConfig.of(settings)
        store = OutboxStore(
            db, dispatch_topic=settings.dispatch_topic, dispatch_topics=config.dispatch_topics
        )
        pruner = Pruner(settings.retention, RetentionStore(db))
        async with asyncio.TaskGroup() as group:
            group.create_task(OutboxRelay(config, store).run(stop))
            for pool in Pools(settings):  # each pool's records against its topic
                own = replace(config, kafka=pool.settings.kafka)
                reconciler = Reconciler(
                    own,
                    OutboxStore(db, dispatch_topic=pool.topic, first=pool.first),
                    TopicViewReader(own.bootstrap, own.kafka),
                )
                group.create_task(reconciler.run(stop))
            group.create_task(pruner.run(stop))
    finally:
        await db.dispose()
