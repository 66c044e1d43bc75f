"""``sluicegate api --workers 2``: two servers on one socket. SIGTERM drains both and the
command exits 0; a server that dies by itself takes the other down, and the command exits
1 for its supervisor to restart it."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from client.api import AsyncClient, RetryPolicy
from plumbing.settings import Settings
from schemas.jobs import JobKind
from schemas.tables import jobs
from sluicegate.local.embedded import free_port
from tests.faults.processes import answering, environment

ROOT = Path(__file__).resolve().parents[2]


@contextmanager
def two_servers(settings: Settings, port: int, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    command = [sys.executable, "-m", "sluicegate", "api", "--port", str(port), "--workers", "2"]
    with open(log, "wb") as out:
        process = subprocess.Popen(
            command, env=environment(settings), cwd=ROOT, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def servers_of(parent: int) -> list[int]:
    """The API processes the command started (not multiprocessing's resource tracker)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            command = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == parent and b"resource_tracker" not in command:
            found.append(int(entry))
    return found


async def test_sigterm_drains_both_servers_and_exits_0(
    settings: Settings, db: AsyncEngine, tmp_path: Path
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with two_servers(settings, port, tmp_path / "api.log") as api:
        await answering(f"{url}/healthz", within_s=60)
        assert len(servers_of(api.pid)) == 2
        # Until the group's lag is first read, admission answers 503 with Retry-After.
        async with AsyncClient(url, tenant="t", retry=RetryPolicy(max_attempts=20)) as client:
            ids = [(await client.submit(JobKind.SUMMARIZE, "text", ttl_s=60)).id for _ in range(10)]
        api.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(api.wait, 30)
    assert code == 0, (tmp_path / "api.log").read_text()[-3000:]
    async with db.connect() as conn:
        assert set(map(str, await conn.scalars(select(jobs.c.id)))) == set(ids)


async def test_a_server_that_dies_stops_the_other_and_the_command_exits_1(
    settings: Settings, tmp_path: Path
) -> None:
    port = free_port()
    with two_servers(settings, port, tmp_path / "api.log") as api:
        await answering(f"http://127.0.0.1:{port}/healthz", within_s=60)
        first, second = servers_of(api.pid)
        os.kill(first, signal.SIGKILL)
        code = await asyncio.to_thread(api.wait, 30)
        assert code == 1
        assert gone(second)  # stopped and reaped by the command before it exited
    assert "exited by itself" in (tmp_path / "api.log").read_text()


def gone(pid: int) -> bool:
    return not Path(f"/proc/{pid}").exists()
