"""The processes of the local stack, as children to spawn: the roles, and the workers of
each pool (``plumbing.pools``) with, on llama.cpp, a server each."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from plumbing.pools import Pools, slug
from plumbing.settings import Settings
from sluicegate.local.embedded import free_port

ENGINE_ROLE = "llama"
"""Role prefix of the engine servers the stack runs (one per worker, stopped after it)."""


@dataclass
class ChildProcess:
    role: str
    args: list[str]
    env: dict[str, str] = field(default_factory=dict)  # on top of the stack's
    process: asyncio.subprocess.Process | None = None
    restarts: int = 0


def is_engine(child: ChildProcess) -> bool:
    return child.role.startswith(f"{ENGINE_ROLE}-")


def engine_env(url: str) -> dict[str, str]:
    """What a llama.cpp server child and its worker share: the server's address."""
    return {"SLUICEGATE_LLAMACPP_URL": url}


def worker_children(
    settings: Settings, engine: str, per_pool: int
) -> tuple[list[ChildProcess], list[ChildProcess]]:
    """(engine servers, workers): ``per_pool`` workers for each pool (``worker-N``; with
    pools configured ``worker-<model>-N``, serving that model), each with a llama.cpp
    server of its own on a free loopback port when ``engine`` is llamacpp (so its slot gate
    sees every request). Static members (KIP-345): a worker the stack restarts takes its
    partitions back without a rebalance of its group."""
    engines: list[ChildProcess] = []
    workers: list[ChildProcess] = []
    for pool in Pools(settings):
        for i in range(per_pool):
            name = f"worker-{slug(pool.model)}-{i + 1}" if settings.pools else f"worker-{i + 1}"
            env = {"SLUICEGATE_ENGINE": engine, "SLUICEGATE_WORKER_GROUP_INSTANCE_ID": name}
            if settings.pools:
                env["SLUICEGATE_WORKER_MODEL"] = pool.model
            if engine == "llamacpp":
                served = engine_env(f"http://127.0.0.1:{free_port()}")
                engines.append(
                    ChildProcess(f"{ENGINE_ROLE}-{len(engines) + 1}", ["llama-server"], env=served)
                )
                env.update(served)
            workers.append(ChildProcess(name, ["worker"], env=env))
    return engines, workers
