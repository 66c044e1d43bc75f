"""Sluicegate's roles as separate processes, started as a user starts them
(``python -m sluicegate ROLE`` with ``SLUICEGATE_*`` variables), to be broken."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from plumbing.settings import Settings
from schemas.constants import M_JOBS_RUNNING


def environment(settings: Settings) -> dict[str, str]:
    """The variables that give a process ``settings`` (the fields that were set)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICEGATE_")}
    values = settings.model_dump(mode="json", include=settings.model_fields_set)
    for name, value in values.items():
        if value is None:
            continue
        env[f"SLUICEGATE_{name.upper()}"] = value if isinstance(value, str) else json.dumps(value)
    env["PYTHONUNBUFFERED"] = "1"
    return env


@dataclass
class Role:
    name: str
    process: subprocess.Popen[bytes]
    log: Path

    def kill(self) -> None:
        """SIGKILL: no drain, no goodbye to the group, nothing flushed."""
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def terminate(self, timeout_s: float) -> tuple[int, float]:
        """SIGTERM; its exit code and how long it took to exit."""
        started = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout=timeout_s)
        return code, time.monotonic() - started

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@dataclass
class Roles:
    settings: Settings
    directory: Path
    started: list[Role] = field(default_factory=list)

    def start(self, role: str, **overrides: object) -> Role:
        settings = self.settings.model_copy(update=overrides) if overrides else self.settings
        log = self.directory / f"{role}-{len(self.started)}.log"
        with open(log, "wb") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "sluicegate", role],
                env=environment(settings),
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        started = Role(role, process, log)
        self.started.append(started)
        return started


@contextmanager
def roles(settings: Settings, directory: Path) -> Iterator[Roles]:
    """Start roles; whatever still runs at the end is stopped (SIGTERM, then SIGKILL)."""
    running = Roles(settings, directory)
    try:
        yield running
    finally:
        for role in running.started:
            if role.process.poll() is None:
                role.process.send_signal(signal.SIGTERM)
        for role in running.started:
            try:
                role.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                role.process.kill()
                role.process.wait()


async def answering(url: str, within_s: float) -> None:
    """Until ``url`` answers 200 (a role that started serves it)."""
    async with asyncio.timeout(within_s), httpx.AsyncClient() as client:
        while True:
            try:
                if (await client.get(url)).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.2)


async def jobs_running(probe: httpx.AsyncClient, port: int) -> int | None:
    """Jobs a worker runs now, from the metrics it serves on ``port`` (None until it
    serves them), whatever labels the sample carries (its pool's ``model``)."""
    try:
        r = await probe.get(f"http://127.0.0.1:{port}/metrics", timeout=2)
    except httpx.HTTPError:
        return None
    running = [
        sample.value
        for family in text_string_to_metric_families(r.text)
        for sample in family.samples
        if sample.name == M_JOBS_RUNNING
    ]
    return int(sum(running))


async def running_at_least(port: int, count: int, within_s: float) -> None:
    """Until the worker whose metrics are on ``port`` runs ``count`` jobs or more."""
    async with httpx.AsyncClient() as probe, asyncio.timeout(within_s):
        while (await jobs_running(probe, port) or 0) < count:
            await asyncio.sleep(0.1)


async def logged(role: Role, text: str, within_s: float) -> None:
    """Until ``text`` is in the role's log."""
    async with asyncio.timeout(within_s):
        while text not in role.output():
            await asyncio.sleep(0.05)


# The worker logs this once it takes no more records, at stop (workers/consumer.py).
DRAINING = "stopping: no more records taken"

# The worker's rebalance listener logs each assignment and each revoke, on either protocol.
ASSIGNED = re.compile(r"assigned partitions \[[\d, ]*\]; holding \[([\d, ]*)\]")
HOLDING = re.compile(r"(?:assigned|revoked) partitions \[[\d, ]*\]; holding \[([\d, ]*)\]")


async def assigned(role: Role, times: int = 1, within_s: float = 60) -> set[int]:
    """The partitions the worker held after its ``times``-th assignment, from its log,
    once there is one."""
    async with asyncio.timeout(within_s):
        while len(found := ASSIGNED.findall(role.output())) < times:
            await asyncio.sleep(0.2)
    return partitions(found[times - 1])


def holds(role: Role) -> set[int]:
    """The partitions the worker holds now, from its log (none before an assignment)."""
    found = HOLDING.findall(role.output())
    return partitions(found[-1]) if found else set()


def partitions(numbers: str) -> set[int]:
    """The partition numbers of one listener line's ``holding [...]``."""
    return {int(p) for p in re.findall(r"\d+", numbers)}
