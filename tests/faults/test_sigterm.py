"""Every role, started as a user starts it, exits 0 on SIGTERM, within its bound."""

from __future__ import annotations

from pathlib import Path

import pytest

from plumbing.settings import Settings
from sluicegate.local.embedded import free_port
from tests.faults.processes import answering, roles

pytestmark = pytest.mark.timeout(180)

ROLES = ("api", "relay", "worker", "webhooks")


async def test_every_role_exits_zero_on_sigterm(settings: Settings, tmp_path: Path) -> None:
    with roles(settings, tmp_path) as started:
        running = {}
        for role in ROLES:
            port = free_port()
            overrides: dict[str, object] = {"metrics_port": port}
            if role == "api":
                overrides = {"api_port": port}
            running[role] = (started.start(role, **overrides), port)
        # Each is up: it serves its metrics (the API, its own /metrics).
        for _role, (_, port) in running.items():
            await answering(f"http://127.0.0.1:{port}/metrics", within_s=60)
        for role, (process, _) in running.items():
            code, took_s = process.terminate(timeout_s=60)
            assert code == 0, (
                f"{role} exited {code} after {took_s:.1f} s:\n{process.output()[-3000:]}"
            )
