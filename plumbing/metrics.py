"""One Prometheus registry per role, so a process exports its own role's families only.

Every role's metrics are defined at import time, and ``sluicegate`` imports every role, so
the default registry would make the API export the workers' gauges and each worker the
API's. Instead each role's metrics are registered in ``registry(role)``, which also holds
the process, platform and garbage-collector collectors, and a process serves only the
registry of the role it runs (``serve``, or ``exposition`` for the API's ``/metrics``).

``RETRIES`` is shared: each role retries what failed for a while (the database, the broker)
through ``plumbing.retry`` and counts it in the registry of the role it runs.
"""

from __future__ import annotations

from typing import Literal

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    generate_latest,
    start_http_server,
)

from schemas.constants import M_RETRIES

Role = Literal["api", "relay", "worker", "webhooks"]
ROLES: tuple[Role, ...] = ("api", "relay", "worker", "webhooks")

RETRIES = Counter(
    M_RETRIES,
    "Operations retried after a transient error (a deadlock, a serialization failure, a lost "
    "connection, the database or the broker failing), by operation and error",
    ["operation", "error"],
    registry=None,
)


def _new() -> CollectorRegistry:
    registry = CollectorRegistry()
    for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR, RETRIES):
        registry.register(collector)
    return registry


_REGISTRIES: dict[Role, CollectorRegistry] = {role: _new() for role in ROLES}


def registry(role: Role) -> CollectorRegistry:
    """The registry of ``role``'s metrics."""
    return _REGISTRIES[role]


def serve(role: Role, port: int | None) -> None:
    """Serve ``role``'s metrics on ``port`` (nothing when it is None)."""
    if port is not None:
        start_http_server(port, registry=registry(role))


def exposition(role: Role) -> bytes:
    """``role``'s metrics in Prometheus' text format."""
    return generate_latest(registry(role))
