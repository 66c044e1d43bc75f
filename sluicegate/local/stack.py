"""The local stack: embedded services and the Sluicegate processes, supervised together."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx

from plumbing.kafka import ensure_topics
from plumbing.pools import Pools
from plumbing.settings import Settings
from sluicegate import migrate
from sluicegate.local import info as stack_info
from sluicegate.local.broker.base import Broker, BrokerInfo
from sluicegate.local.broker.choose import Choice, make_broker
from sluicegate.local.broker.tansu import WORKAROUNDS as TANSU_WORKAROUNDS
from sluicegate.local.children import ChildProcess, is_engine, worker_children
from sluicegate.local.embedded import EmbeddedPostgres, free_port, promise
from sluicegate.local.lock import DataDirLock
from sluicegate.local.model import served_names

log = logging.getLogger(__name__)

RESTART_BACKOFF_S = 1.0
STOP_GRACE_S = 5.0
ENGINE_READY_S = 60.0


class StartFailed(Exception):
    """A process of the stack exited before it was ready; the message says which and why."""


@dataclass
class Stack:
    """Starts PostgreSQL and a broker when none is configured, then the processes."""

    settings: Settings
    workers: int = 2  # of each pool (plumbing.pools)
    # The workers' engine ("llamacpp": a llama.cpp server each, ``worker_children``).
    engine: str = "sim"
    # The data directory's lock, held by the caller; told which processes the stack runs.
    lock: DataDirLock | None = None
    log_dir: Path | None = None  # None: children write to our stdout/stderr
    # The broker to start when none is configured (``sluicegate.local.broker.choose``).
    broker: Choice = field(default_factory=lambda: Choice(kind="tansu"))
    database_url: str = ""
    bootstrap: str = ""
    fresh_broker: bool = False
    redispatched: int = 0  # unfinished jobs given a new dispatch record on a new log
    # Called when a broker of the stack's starts on an empty log (Tansu at every start,
    # Apache Kafka when it formats a new one), before the relay and workers (re)start.
    on_fresh_broker: Callable[[], Awaitable[None]] | None = None
    _postgres: EmbeddedPostgres | None = None
    _broker: Broker | None = None
    _children: list[ChildProcess] = field(default_factory=list)
    _logs: list[IO[bytes]] = field(default_factory=list)

    @property
    def api_url(self) -> str:
        return f"http://{self.settings.api_host}:{self.settings.api_port}"

    @property
    def engine_urls(self) -> list[str]:
        """The engine servers the stack runs (one per worker), once started."""
        return [c.env["SLUICEGATE_LLAMACPP_URL"] for c in self._children if is_engine(c)]

    async def start_services(self) -> None:
        """PostgreSQL, the broker, migrations and topics."""
        promise(self.settings.api_port)  # neither service may take the API's port
        data_dir = self.settings.data_dir
        data_dir.mkdir(parents=True, exist_ok=True)
        if self.settings.database_url:
            self.database_url = self.settings.database_url
        else:
            self._postgres = EmbeddedPostgres(data_dir / "postgres")
            await asyncio.to_thread(self._postgres.start)
            self.database_url = self._postgres.url
        await migrate.upgrade_async(self.database_url)
        if self.settings.kafka_bootstrap_servers:
            self.bootstrap = self.settings.kafka_bootstrap_servers
        else:
            self._broker = make_broker(self.broker, self.settings)
            try:
                await self._broker.start()
            finally:
                self._record_processes()
            self.bootstrap = self._broker.bootstrap
            self.fresh_broker = self._broker.new_log
        await ensure_topics(
            self.bootstrap,
            Pools(self.settings).topic_partitions(),
            replication_factor=self.settings.replication_factor,
        )

    def child_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("SLUICEGATE_METRICS_PORT", None)  # each role gets its own (``_metrics_env``)
        env["SLUICEGATE_DATABASE_URL"] = self.database_url
        env["SLUICEGATE_KAFKA_BOOTSTRAP_SERVERS"] = self.bootstrap
        if self.broker_info is not None and self.broker_info.kind == "tansu":
            env.update({f"SLUICEGATE_{name}": value for name, value in TANSU_WORKAROUNDS.items()})
        env["SLUICEGATE_DATA_DIR"] = str(self.settings.data_dir)
        if self.settings.pools:  # a pool per model, each with its workers
            env["SLUICEGATE_POOLS"] = json.dumps(self.settings.pools)
        elif "models" not in self.settings.model_fields_set:  # only what its workers serve
            env["SLUICEGATE_MODELS"] = json.dumps(served_names(self.settings, self.engine))
        env["PYTHONUNBUFFERED"] = "1"
        return env

    async def start_processes(self) -> None:
        engines, workers = worker_children(self.settings, self.engine, self.workers)
        self._children = [
            ChildProcess("api", ["api"]),
            *engines,
            ChildProcess("relay", ["relay"]),
            ChildProcess("webhooks", ["webhooks"]),
            *workers,
        ]
        self._give_metrics_ports()
        for child in self._children:
            await self._spawn(child)
        await self._wait_api_ready()
        for child in engines:
            await self._wait_healthy(child)
        stack_info.write_info(self.settings.data_dir, self.info())

    def _give_metrics_ports(self) -> None:
        """Each role but the API (which serves /metrics itself) on a loopback port of its
        own: consecutive from ``metrics_port`` when that is set, else free ones. It keeps
        the port across its restarts."""
        base = self.settings.metrics_port
        roles = [c for c in self._children if c.role != "api" and not is_engine(c)]
        taken = {self.settings.api_port, *(_port_of(url) for url in self.engine_urls)}
        for i, child in enumerate(roles):
            port = base + i if base is not None else _free_port_besides(taken)
            taken.add(port)
            child.env["SLUICEGATE_METRICS_PORT"] = str(port)

    def metrics_urls(self) -> dict[str, str]:
        """Where each role's Prometheus metrics are scraped."""
        urls = {"api": f"{self.api_url}/metrics"}
        for child in self._children:
            if (port := child.env.get("SLUICEGATE_METRICS_PORT")) is not None:
                urls[child.role] = f"http://127.0.0.1:{port}/metrics"
        return urls

    def urls(self) -> list[tuple[str, str]]:
        """(what, where) for the banner: the API, each role's metrics, the logs."""
        rows = [("API", self.api_url)]
        rows += [(f"{role} metrics", url) for role, url in self.metrics_urls().items()]
        rows.append(("logs", str(self.log_dir) if self.log_dir else "this terminal"))
        return rows

    def info(self) -> dict[str, Any]:
        """What ``data_dir/stack.json`` says while the stack runs (``stack_info``)."""
        return {
            "pid": os.getpid(),
            "api": self.api_url,
            "database": self.database_url,
            "kafka": self.bootstrap,
            "broker": self._broker_record(),
            "metrics": self.metrics_urls(),
            "logs": str(self.log_dir) if self.log_dir else None,
            "data_dir": str(self.settings.data_dir),
        }

    @property
    def broker_info(self) -> BrokerInfo | None:
        """The broker the stack runs; None when it uses a configured one."""
        return self._broker.info if self._broker is not None else None

    def _broker_record(self) -> dict[str, Any]:
        info = self.broker_info
        if info is None or self._broker is None:
            return {"kind": "external", "version": None, "bootstrap": self.bootstrap, "pid": None}
        return {
            "kind": info.kind,
            "version": info.version,
            "bootstrap": info.bootstrap,
            "pid": self._broker.pid,
        }

    async def _wait_healthy(self, child: ChildProcess) -> None:
        """Wait for an engine server's /health; an error naming its log if it exits."""
        url = child.env["SLUICEGATE_LLAMACPP_URL"]
        async with httpx.AsyncClient(timeout=2.0) as http:
            async with asyncio.timeout(ENGINE_READY_S):
                while True:
                    if child.process is not None and child.process.returncode is not None:
                        raise StartFailed(
                            f"{child.role} exited with code {child.process.returncode}"
                            + self._see_log(child)
                        )
                    with contextlib.suppress(httpx.HTTPError):
                        if (await http.get(f"{url}/health")).status_code == 200:
                            return
                    await asyncio.sleep(0.1)

    def _see_log(self, child: ChildProcess) -> str:
        """Its last log line and where its log is (above, when it writes to our output)."""
        if self.log_dir is None:
            return " (its last lines are above)"
        path = self.log_dir / f"{child.role}.log"
        lines = path.read_text(errors="replace").strip().splitlines() if path.exists() else []
        last = f": {lines[-1].strip()}" if lines else ""
        return f"{last} (log: {path})"

    async def _spawn(self, child: ChildProcess) -> None:
        out: IO[bytes] | None = None
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            out = open(self.log_dir / f"{child.role}.log", "ab")  # noqa: ASYNC230, SIM115 (kept open)
            self._logs.append(out)
        child.process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "sluicegate",
            *child.args,
            env={**self.child_env(), **child.env, "SLUICEGATE_PROCESS_NAME": child.role},
            stdout=out,
            stderr=asyncio.subprocess.STDOUT if out is not None else None,
            start_new_session=True,  # our signals reach them only through us
        )
        self._record_processes()

    def _record_processes(self) -> None:
        """Tell the lock what runs, so that a stack after us stops it if we die."""
        if self.lock is None:
            return
        pids = [c.process.pid for c in self._children if c.process is not None]
        if self._broker is not None and self._broker.pid is not None:
            pids.append(self._broker.pid)
        self.lock.children(pids)

    async def _wait_api_ready(self, timeout_s: float = 30.0) -> None:
        async with httpx.AsyncClient(timeout=2.0) as http:
            async with asyncio.timeout(timeout_s):
                while True:
                    api = self._children[0].process
                    if api is not None and api.returncode is not None:
                        raise StartFailed(
                            f"the API exited with code {api.returncode}"
                            + self._see_log(self._children[0])
                        )
                    with contextlib.suppress(httpx.HTTPError):
                        if (await http.get(f"{self.api_url}/healthz")).status_code == 200:
                            return
                    await asyncio.sleep(0.1)

    async def supervise(self, stop: asyncio.Event) -> None:
        """Restart a process that dies on its own, and the broker, until ``stop`` is set."""
        broker_exit: asyncio.Future[Any] | None = None
        while not stop.is_set():
            waits: dict[asyncio.Future[Any], ChildProcess | None] = {
                asyncio.ensure_future(c.process.wait()): c
                for c in self._children
                if c.process is not None
            }
            if self._broker is not None:
                if broker_exit is None or broker_exit.done():
                    broker_exit = asyncio.ensure_future(asyncio.to_thread(self._broker.wait))
                waits[broker_exit] = None
            stopper: asyncio.Future[Any] = asyncio.ensure_future(stop.wait())
            every = [stopper, *waits]
            done, _ = await asyncio.wait(every, return_when=asyncio.FIRST_COMPLETED)
            for future in every:
                if future is not broker_exit:
                    future.cancel()
            if stop.is_set():
                return
            for future in done:
                child = waits[future]
                if child is None:
                    await self._replace_broker()
                    break
                child.restarts += 1
                code = child.process.returncode if child.process else None
                log.warning("%s exited with %s; restarting", child.role, code)
                await asyncio.sleep(RESTART_BACKOFF_S)
                await self._spawn(child)

    async def _replace_broker(self) -> None:
        """The broker died. Apache Kafka starts again on its log, on the same address, and
        the clients reconnect. Tansu took every record and offset with it: start a new one,
        restart the relay and the workers (their positions and commit points belong to the
        lost log), and give every unfinished job a fresh dispatch record."""
        assert self._broker is not None
        if self._broker.info.durable:
            log.error("the broker exited; starting it again on its log")
            await self._broker.restart()
            self._record_processes()
            stack_info.write_info(self.settings.data_dir, self.info())  # its new pid
            return
        log.error("the Tansu broker exited; restarting it with an empty log")
        pipeline = [c for c in self._children if c.role != "api" and not is_engine(c)]
        await self._terminate([c.process for c in pipeline if c.process is not None])
        await self._broker.restart()
        self._record_processes()
        await ensure_topics(
            self.bootstrap,
            Pools(self.settings).topic_partitions(),
            replication_factor=self.settings.replication_factor,
        )
        if self.on_fresh_broker is not None:
            await self.on_fresh_broker()
        for child in pipeline:
            await self._spawn(child)

    async def stop(self) -> None:
        """SIGTERM every process, give them time to drain, then stop the services. The
        engine servers go last: a draining worker still finishes its jobs on them."""
        stack_info.remove_info(self.settings.data_dir)
        for group in (
            [c for c in self._children if not is_engine(c)],
            [c for c in self._children if is_engine(c)],
        ):
            await self._terminate([c.process for c in group if c.process is not None])
        for out in self._logs:
            out.close()
        if self._broker is not None:
            await asyncio.to_thread(self._broker.stop)
        if self._postgres is not None:
            await asyncio.to_thread(self._postgres.stop)

    async def _terminate(self, processes: list[asyncio.subprocess.Process]) -> None:
        running = [p for p in processes if p.returncode is None]
        for process in running:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
        grace = self.settings.drain_timeout_s + STOP_GRACE_S
        for process in running:
            try:
                await asyncio.wait_for(process.wait(), grace)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()


def _port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def _free_port_besides(taken: set[int]) -> int:
    """A free loopback port none of the stack's other processes was given (two asks of the
    kernel for a free port can get the same one, as nothing holds it in between)."""
    while (port := free_port()) in taken:
        pass
    return port
