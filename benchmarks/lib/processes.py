"""The stack as real processes, as a user starts them: ``python -m sluicegate api``,
``relay``, ``worker`` and ``webhooks``, each given the run's settings through its
environment; waiting for the API, and warming the worker up over HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from benchmarks.lib.sampling import family_usage
from benchmarks.lib.stack import TERMINAL
from plumbing.settings import Settings
from schemas import constants

ROLES = ("api", "relay", "worker", "webhooks")


def environment(settings: Settings) -> dict[str, str]:
    """The variables that make ``Settings()`` in a process equal ``settings``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICEGATE_")}
    for name, value in settings.model_dump(mode="json", include=settings.model_fields_set).items():
        if value is not None:
            env[f"SLUICEGATE_{name.upper()}"] = (
                value if isinstance(value, str) else json.dumps(value)
            )
    env["PYTHONUNBUFFERED"] = "1"
    return env


@dataclass
class Stack:
    """The roles as processes, their logs in ``directory``; the relay alone is given
    ``relay_metrics_port`` as its Prometheus port when it is set (the others would try to
    bind the same one)."""

    settings: Settings
    directory: Path
    relay_metrics_port: int | None = None
    workers: int = 1  # the first is "worker", the others "worker-2", ...
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start(self) -> None:
        env = environment(self.settings)
        extra = [(f"worker-{n}", "worker") for n in range(2, self.workers + 1)]
        for name, role in [*((r, r) for r in ROLES), *extra]:
            own = dict(env)
            if role == "relay" and self.relay_metrics_port is not None:
                own["SLUICEGATE_METRICS_PORT"] = str(self.relay_metrics_port)
            if self.workers > 1 and role == "worker":  # each a member of the group
                own["SLUICEGATE_WORKER_GROUP_INSTANCE_ID"] = name
            with open(self.directory / f"{name}.log", "wb") as log:
                self.processes[name] = subprocess.Popen(
                    [sys.executable, "-m", "sluicegate", role],
                    env=own,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )

    def check(self) -> None:
        for role, process in self.processes.items():
            if process.poll() is not None:
                tail = (self.directory / f"{role}.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{role} exited with {process.returncode}:\n{tail}")

    def stop(self) -> dict[str, int | None]:
        """SIGTERM every role, SIGKILL what is still there after 30 s; the exit codes."""
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes.values():
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        return {role: p.returncode for role, p in self.processes.items()}

    def memory(self) -> tuple[dict[str, float], dict[str, float]]:
        """Each role's RSS (MiB) and CPU seconds so far (children included)."""
        rss, cpu = {}, {}
        for role, process in self.processes.items():
            usage = family_usage(process.pid)
            if usage is not None:
                rss[role], cpu[role] = usage
        return rss, cpu


async def warm_up(client: httpx.AsyncClient, count: int) -> None:
    """Jobs of another tenant, until they end: the worker has joined and measured speed."""
    ids = []
    for _ in range(count):
        r = await client.post(
            "/v1/jobs",
            json={"kind": "summarize", "input": "A short warm-up note. " * 40, "max_tokens": 64},
            headers={constants.HEADER_TENANT: "warmup"},
        )
        r.raise_for_status()
        ids.append(r.json()["id"])
    async with asyncio.timeout(180):
        for job_id in ids:
            while True:
                view = await client.get(
                    f"/v1/jobs/{job_id}",
                    params={"wait": 10},
                    headers={constants.HEADER_TENANT: "warmup"},
                )
                if view.json()["state"] in TERMINAL:
                    break


async def api_ready(client: httpx.AsyncClient, stack: Stack) -> None:
    async with asyncio.timeout(60):
        while True:
            stack.check()
            with contextlib.suppress(httpx.HTTPError):
                if (await client.get("/healthz")).status_code == 200:
                    return
            await asyncio.sleep(0.3)
