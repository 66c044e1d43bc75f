"""Start ``sluicegate up`` as a user would: a separate process, driven over HTTP."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import httpx
import psutil

from client.samples import sample_documents
from plumbing.settings import Settings
from sluicegate.local.broker import dist
from sluicegate.local.embedded import free_port
from tests.support import brokers

STARTUP_S = 90


@dataclass
class RunningStack:
    process: subprocess.Popen[str]
    api_url: str
    log: IO[str]
    database_url: str = ""
    bootstrap: str = ""
    broker: dict[str, object] = field(default_factory=dict)  # stack.json's "broker"
    headers: dict[str, str] = field(default_factory=dict)  # the local API key
    output: list[str] = field(default_factory=list)
    descendants: list[psutil.Process] = field(default_factory=list)

    def log_text(self) -> str:
        """What `sluicegate up` printed so far."""
        return Path(self.log.name).read_text()

    def stop(self, timeout_s: float = 60) -> int:
        self.descendants = psutil.Process(self.process.pid).children(recursive=True)
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=timeout_s)
        finally:
            self.log.close()


def stack_env(data_dir: Path) -> dict[str, str]:
    """What a test's `up` or `demo` runs with: its own data directory and, on the suite's
    broker (SLUICEGATE_TEST_BROKER), Apache Kafka from the jars pulled once for every test."""
    env = {**os.environ, "SLUICEGATE_DATA_DIR": str(data_dir), "PYTHONUNBUFFERED": "1"}
    for key in ("SLUICEGATE_DATABASE_URL", "SLUICEGATE_KAFKA_BOOTSTRAP_SERVERS"):
        env.pop(key, None)
    kind = brokers.default_kind()
    env.setdefault("SLUICEGATE_BROKER", kind)
    if kind == "kafka" or dist.is_pulled(dist.kafka_home(Settings().data_dir)):
        # For the tests that ask for Apache Kafka by name on a Tansu run too.
        env.setdefault("SLUICEGATE_KAFKA_HOME", str(brokers.kafka_home()))
        env.setdefault("SLUICEGATE_KAFKA_HEAP_MB", str(brokers.HEAP_MB))
    return env


def start_stack(
    data_dir: Path,
    *,
    workers: int,
    extra_env: dict[str, str] | None = None,
    args: list[str] | None = None,
) -> RunningStack:
    port = free_port()
    env = {
        **stack_env(data_dir),
        "SLUICEGATE_API_PORT": str(port),
        "COLUMNS": "200",
        **(extra_env or {}),
    }
    out = data_dir / "up.out"
    seen = out.stat().st_size if out.exists() else 0  # a restart appends to the same file
    log = open(out, "a")  # noqa: SIM115
    args = list(args or [])
    if "--engine" not in args:
        # `up` serves the real model once it is pulled; the tests that do not name an engine
        # rely on the simulator's speed, so they ask for it.
        args += ["--engine", "sim"]
    process = subprocess.Popen(
        [sys.executable, "-m", "sluicegate", "up", "--workers", str(workers), *args],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )
    stack = RunningStack(process=process, api_url=f"http://127.0.0.1:{port}", log=log)
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline:
        text = out.read_text()[seen:]
        if "sluicegate is up" in text:
            stack.database_url = re.search(r"database\s+(\S+)", text).group(1)
            info = json.loads((data_dir / "stack.json").read_text())
            stack.bootstrap = info["kafka"]
            stack.broker = info["broker"]
            # The stack made its own key for the default tenant, as a user's would.
            key = (data_dir / "api_key").read_text().strip()
            stack.headers = {"Authorization": f"Bearer {key}"}
            return stack
        if process.poll() is not None:
            break
        time.sleep(0.2)
    process.kill()
    process.wait()
    log.close()
    raise AssertionError(f"sluicegate up did not start:\n{(data_dir / 'up.out').read_text()}")


def wait_state(stack: RunningStack, ids: list[str], state: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    with httpx.Client(base_url=stack.api_url, headers=stack.headers, timeout=10) as client:
        while time.monotonic() < deadline:
            if all(client.get(f"/v1/jobs/{i}").json()["state"] == state for i in ids):
                return
            time.sleep(0.2)
    raise AssertionError(f"not all {len(ids)} jobs {state} after {timeout_s}s")


def wait_terminal(
    stack: RunningStack, ids: list[str], timeout_s: float = 120
) -> dict[str, dict[str, object]]:
    views: dict[str, dict[str, object]] = {}
    deadline = time.monotonic() + timeout_s
    with httpx.Client(base_url=stack.api_url, headers=stack.headers, timeout=10) as client:
        while time.monotonic() < deadline:
            for job_id in ids:
                if job_id in views:
                    continue
                view = client.get(f"/v1/jobs/{job_id}").json()
                if view["state"] in {"succeeded", "failed", "expired", "cancelled", "abandoned"}:
                    views[job_id] = view
            if len(views) == len(ids):
                return views
            time.sleep(0.2)
    raise AssertionError(f"{len(ids) - len(views)} jobs not terminal after {timeout_s}s")


def submit(stack: RunningStack, count: int) -> list[str]:
    """``count`` summarize jobs of the bundled samples; each must be accepted."""
    docs = [text for _, text in sample_documents()]
    ids = []
    with httpx.Client(base_url=stack.api_url, headers=stack.headers, timeout=10) as client:
        for i in range(count):
            response = client.post(
                "/v1/jobs",
                json={"kind": "summarize", "input": docs[i % len(docs)], "max_tokens": 60},
            )
            assert response.status_code == 202, response.text
            ids.append(response.json()["id"])
    return ids
