"""``sluicegate up`` and ``sluicegate demo``: the local stack, one per data directory."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

from rich.console import Console

from client import demo
from client.samples import sample_documents
from plumbing.db import make_engine
from plumbing.pools import Pools
from plumbing.settings import Settings
from producers.outbox.repository import OutboxStore
from producers.tenancy.repository import KeyStore
from schemas import constants
from sluicegate.local import key as local_key
from sluicegate.local import model as models
from sluicegate.local.broker.choose import Choice, choose
from sluicegate.local.broker.dist import KafkaUnavailable
from sluicegate.local.embedded import EmbeddedError
from sluicegate.local.lock import DataDirLock, StackRunning, stop_orphans
from sluicegate.local.stack import Stack, StartFailed
from sluicegate.process import configure_logging, run_until_signal


def run(settings: Settings, args: argparse.Namespace) -> None:
    configure_logging(settings, args.command)
    if args.command == "up":
        settings = with_models(settings, args.models)
        engine = _engine(settings, args.engine or default_engine(settings, "up"))
        workers = _workers(args.workers, engine)
        _run_stack(
            settings,
            args.broker,
            lambda stop, lock, broker: _up(settings, engine, workers, broker, lock, stop),
        )
        return
    engine = _engine(settings, args.engine or default_engine(settings, "demo"))
    workers = _workers(args.workers, engine, at_least=1)
    docs = _demo_documents(settings, args.dir)
    _run_stack(
        settings,
        args.broker,
        lambda stop, lock, broker: _demo(settings, engine, workers, broker, docs, lock, stop),
    )


def with_models(settings: Settings, models: str | None) -> Settings:
    """``settings`` with a pool for each model of ``--models`` (its own settings where
    SLUICEGATE_POOLS names it); exits with one line for a list that names none or one
    twice."""
    if models is None:
        return settings
    names = [m.strip() for m in models.split(",") if m.strip()]
    if not names:
        sys.exit("--models names no model: give them comma-separated, e.g. --models alpha,beta")
    if len(set(names)) != len(names):
        sys.exit(f"--models names a model twice: {models}")
    pools = {name: settings.pools.get(name, {}) for name in names}
    # A copy, not a new validation: the settings the user set stay the ones set.
    return settings.model_copy(update={"pools": pools, "models": names})


def _broker(settings: Settings, requested: str | None) -> Choice:
    """The broker to start (none is started when SLUICEGATE_KAFKA_BOOTSTRAP_SERVERS is set):
    one line where Apache Kafka was asked for and cannot run, or where ``auto`` falls back."""
    if settings.kafka_bootstrap_servers:
        return Choice(kind="tansu")  # not started: the configured broker is used
    try:
        choice = choose(
            settings, requested or settings.broker, java_home=os.environ.get("JAVA_HOME")
        )
    except KafkaUnavailable as exc:
        sys.exit(f"sluicegate: --broker kafka cannot run ({exc.code}): {exc}")
    if choice.why is not None:
        print(
            f"broker: Tansu, the memory-only fallback (Apache Kafka not used: {choice.why})",
            file=sys.stderr,
        )
    return choice


def _demo_documents(settings: Settings, directory: Path | None) -> list[tuple[str, str]]:
    if directory is None:
        return sample_documents()
    if not directory.exists():
        sys.exit(f"no such folder: {directory}")
    docs, skipped = demo.read_documents([directory], max_bytes=settings.max_input_bytes)
    for skip in skipped:
        print(f"skipped {skip.name}: {skip.message}", file=sys.stderr)
    if not docs:
        sys.exit(f"no documents to summarize in {directory}")
    return docs


async def _local_key(stack: Stack) -> str | None:
    """With keys on, the key this machine's clients use: made once, kept in data_dir. An
    operator key (it sees every tenant), so the local page and `status` show everything;
    a key made before operator keys existed is made one."""
    settings = stack.settings
    if settings.auth != "api_key":
        return None
    key = local_key.read_key(settings)
    db = make_engine(stack.database_url, pool_size=1)
    try:
        store = KeyStore(db)
        if key is not None:
            await store.grant_operator(key)
            return key
        key = await store.create(constants.DEFAULT_TENANT, name="local stack", operator=True)
    finally:
        await db.dispose()
    local_key.write_key(settings, key)
    return key


def _run_stack(
    settings: Settings,
    requested_broker: str | None,
    main: Callable[[asyncio.Event, DataDirLock, Choice], Awaitable[None]],
) -> None:
    """Run a stack on the data directory, which it holds (one stack a directory); a process
    that could not start is one line, not a traceback."""
    lock = DataDirLock(settings.data_dir)
    try:
        left = lock.acquire(api_url=f"http://{settings.api_host}:{settings.api_port}")
    except StackRunning as exc:
        sys.exit(str(exc))
    try:
        if stopped := stop_orphans(left):
            print(f"stopped {len(stopped)} processes a dead stack left running", file=sys.stderr)
        broker = _broker(settings, requested_broker)
        run_until_signal(lambda stop: main(stop, lock, broker))
    except (StartFailed, EmbeddedError) as exc:
        sys.exit(f"sluicegate could not start: {exc}")
    finally:
        lock.release()


def _workers(count: int | None, engine: str, at_least: int = 0) -> int:
    """The workers to run: one per llama.cpp server (each server uses every core)."""
    if count is None:
        return 1 if engine == "llamacpp" else 2
    if count < at_least:
        sys.exit(f"--workers must be at least {at_least}")
    return count


def default_engine(settings: Settings, command: str) -> str:
    """SLUICEGATE_ENGINE when set; else the real model when it is here, else the simulator
    (the demo says so at once; `up`'s banner says it, so that a refusal to start stays one
    line)."""
    if "engine" in settings.model_fields_set:
        return settings.engine
    if models.model_file(settings).is_file():
        return "llamacpp"
    if command == "demo":
        print(
            "no model pulled: the demo runs on the simulator, whose output is simulated "
            "(run `sluicegate model pull` once for real summaries)",
            file=sys.stderr,
        )
    return "sim"


def _engine(settings: Settings, engine: str) -> str:
    """The engine, checked: llamacpp needs the model file (never fetched here)."""
    if engine == "llamacpp" and not (model := models.model_file(settings)).is_file():
        sys.exit(f"no model at {model}: run `sluicegate model pull` first")
    return engine


async def _redispatch(stack: Stack) -> None:
    """The broker started on an empty log (Tansu at every start, Apache Kafka on a new log):
    give every unfinished job a new dispatch record on its pool's topic, and say how many."""
    db = make_engine(stack.database_url, pool_size=1)
    try:
        for pool in Pools(stack.settings):
            store = OutboxStore(db, dispatch_topic=pool.topic, first=pool.first)
            stack.redispatched += await store.redispatch_unfinished()
            await store.reset_ends()  # the recorded ends are of the old cluster too
    finally:
        await db.dispose()


async def _start(stack: Stack) -> str | None:
    """Start everything; returns the local API key (None without keys)."""
    stack.on_fresh_broker = lambda: _redispatch(stack)
    await stack.start_services()
    key = await _local_key(stack)
    if stack.fresh_broker:
        await _redispatch(stack)
    await stack.start_processes()
    return key


async def _up(
    settings: Settings,
    engine: str,
    workers: int,
    broker: Choice,
    lock: DataDirLock,
    stop: asyncio.Event,
) -> None:
    stack = Stack(settings, workers=workers, engine=engine, broker=broker, lock=lock)
    console = Console()
    try:
        key = await _start(stack)
        console.print(banner(stack, key), highlight=False)
        await stack.supervise(stop)
    finally:
        await stack.stop()
        console.print("sluicegate stopped")


def banner(stack: Stack, key: str | None) -> str:
    """Where everything is: the API, the key, each role's metrics, logs and data."""
    settings = stack.settings
    where = local_key.key_file(settings) if key and not settings.api_key else "settings"
    rows = [
        ("API", f"{stack.api_url}  (docs: {stack.api_url}/docs)"),
        ("API key", str(where) if key else "off (auth = tenant_header)"),
        ("database", stack.database_url),
        ("broker", broker_line(stack)),
        ("workers", workers_line(stack)),
        ("engine", engine_line(stack)),
        ("models", models_line(stack)),
        *((label, url) for label, url in stack.urls() if label != "API"),
        ("data", str(settings.data_dir)),
    ]
    width = max(len(label) for label, _ in rows) + 2
    lines = [f"  {label.ljust(width)}{value}" for label, value in rows]
    return "\n".join(
        ["[bold]sluicegate is up[/bold]", *lines, "Ctrl-C or SIGTERM stops everything."]
    )


def broker_line(stack: Stack) -> str:
    """Which broker, where, and what its start did to the unfinished jobs."""
    info = stack.broker_info
    if info is None:
        return f"{stack.bootstrap} (SLUICEGATE_KAFKA_BOOTSTRAP_SERVERS)"
    if info.kind == "kafka":
        what = f"Apache Kafka {info.version} (KRaft, log in {stack.settings.data_dir / 'kafka'})"
    else:
        what = f"Tansu {info.version} (memory only: its log is lost when it stops)"
    line = f"{info.bootstrap}  {what}"
    if stack.fresh_broker and stack.redispatched:
        line += f"; {stack.redispatched} unfinished jobs re-dispatched on its new log"
    return line


def workers_line(stack: Stack) -> str:
    pools = len(stack.settings.pools)
    if pools < 2:
        return str(stack.workers)
    return f"{stack.workers} per model ({stack.workers * pools} in all)"


def models_line(stack: Stack) -> str:
    """The names a request's ``model`` may take (the API refuses others)."""
    settings = stack.settings
    if settings.pools:
        return (
            ", ".join(settings.pools) + "  (a worker pool each; a request's `model`: one of these)"
        )
    names = settings.models if "models" in settings.model_fields_set else None
    names = names or models.served_names(settings, stack.engine)
    return ", ".join(names) + "  (a request's `model`: one of these, or none)"


def engine_line(stack: Stack) -> str:
    """Which engine serves which model, and plainly when the output is simulated."""
    if stack.engine == "llamacpp":
        model = models.model_file(stack.settings).name
        return f"llamacpp: the real model {model} on llama.cpp " + " ".join(stack.engine_urls)
    if stack.engine == "sim":
        return (
            "sim: SIMULATED output (a summary echoes its input); `--engine llamacpp` serves "
            "the real model once `sluicegate model pull` has run"
        )
    return f"{stack.engine}: {stack.settings.vllm_model}"


async def _demo(
    settings: Settings,
    engine: str,
    workers: int,
    broker: Choice,
    docs: list[tuple[str, str]],
    lock: DataDirLock,
    stop: asyncio.Event,
) -> None:
    stack = Stack(
        settings,
        workers=workers,
        engine=engine,
        broker=broker,
        lock=lock,
        log_dir=settings.data_dir / "logs",
    )
    console = Console()
    try:
        with console.status("starting the local stack (PostgreSQL, broker, API, workers)"):
            key = await _start(stack)
        for label, line in (("engine", engine_line(stack)), ("broker", broker_line(stack))):
            console.print(f"{label}: {line}", highlight=False, soft_wrap=True)  # URLs unbroken
        results = settings.data_dir / "demo" / "results.jsonl"
        run = asyncio.ensure_future(
            demo.run_demo(stack.api_url, docs, console=console, api_key=key, results=results)
        )
        stopper = asyncio.ensure_future(stop.wait())
        await asyncio.wait([run, stopper], return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
        if not run.done():
            run.cancel()
            raise SystemExit(130)
        jobs = run.result()
        console.print(f"{len(jobs)} jobs terminal; logs in {settings.data_dir / 'logs'}")
    finally:
        await stack.stop()
