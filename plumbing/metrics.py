"""One Prometheus registry per role, so a process exports its own role's families only.

Every role's metrics are defined at import time, and ``sluicegate`` imports every role, so
the default registry would make the API export the workers' gauges and each worker the
API's. Instead each role's metrics are registered in ``registry(role)``, which also holds
the process, platform and garbage-collector collectors, and a process serves only the
registry of the role it runs (``serve``, or ``exposition`` for the API's ``/metrics``).

``RETRIES`` is shared: each role retries what failed for a while (the database, the broker)
through ``plumbing.retry`` and counts it in the registry of the role it runs.

``label`` gives every sample of a role's ``sluicegate_*`` families labels of the process, as
it exports them: a worker's pool model (``model``), so no call site names it. The registry
itself keeps the samples as they are defined (``get_sample_value`` in a test reads them
without these labels); only ``serve`` and ``exposition`` add them.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator, Mapping
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
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import RestrictedRegistry

from schemas.constants import M_AT_ONCE, M_JOINED, M_RETRIES

Role = Literal["api", "relay", "worker", "webhooks"]
ROLES: tuple[Role, ...] = ("api", "relay", "worker", "webhooks")
# The families ``label`` adds labels to: ours, not the process and runtime collectors'.
PREFIX = "sluicegate_"
# The labels ``label`` gives each role's families: a worker serves one pool, its model.
# tests/unit/deploy reads this to know the labels a dashboard may select by.
CONSTANT_LABELS: dict[Role, frozenset[str]] = {
    "api": frozenset(),
    "relay": frozenset(),
    "worker": frozenset({"model"}),
    "webhooks": frozenset(),
}

RETRIES = Counter(
    M_RETRIES,
    "Operations retried after a transient error (a deadlock, a serialization failure, a lost "
    "connection, the database or the broker failing), by operation and error",
    ["operation", "error"],
    registry=None,
)

AT_ONCE = Counter(
    M_AT_ONCE,
    "Outbox rows their writer (the API, a worker) published at once (outcome=published), or "
    "left to the relay (outcome=left_to_relay: the broker down, too many waiting, stopping)",
    ["outcome"],
    registry=None,
)

JOINED = Counter(
    M_JOINED,
    "Writes that waited to join another transaction (plumbing.unit_of_work): committed in "
    "one (outcome=joined), or alone when none came in time or it failed (outcome=alone)",
    ["outcome"],
    registry=None,
)


def _new() -> CollectorRegistry:
    registry = CollectorRegistry()
    for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR, RETRIES):
        registry.register(collector)
    return registry


_REGISTRIES: dict[Role, CollectorRegistry] = {role: _new() for role in ROLES}
for _role in ("api", "worker"):  # the writers that publish at once and join writes
    _REGISTRIES[_role].register(AT_ONCE)
    _REGISTRIES[_role].register(JOINED)
_LABELS: dict[Role, dict[str, str]] = {role: {} for role in ROLES}


def registry(role: Role) -> CollectorRegistry:
    """The registry of ``role``'s metrics."""
    return _REGISTRIES[role]


def label(role: Role, **labels: str) -> None:
    """From now on, every sample of ``role``'s ``sluicegate_*`` families is exported with
    ``labels`` (``label("worker", model="beta")``), those it was given earlier replaced;
    ``label(role)`` exports them as defined again. The names must be ``CONSTANT_LABELS[role]``.
    A sample that has a label of that name already keeps its own value."""
    if labels and set(labels) != CONSTANT_LABELS[role]:
        wanted = ", ".join(sorted(CONSTANT_LABELS[role])) or "none"
        raise ValueError(f"{role}: labels {sorted(labels)}; a {role} takes {wanted}")
    _LABELS[role] = dict(labels)


def labelled(family: Metric, labels: Mapping[str, str]) -> Metric:
    """``family`` with ``labels`` added to each of its samples (a copy; the family itself
    when it is not ours or there is nothing to add)."""
    if not labels or not family.name.startswith(PREFIX):
        return family
    relabelled = copy.copy(family)
    relabelled.samples = [
        sample._replace(labels={**labels, **sample.labels}) for sample in family.samples
    ]
    return relabelled


class _Export(CollectorRegistry):
    """What a process exports of ``role``: its registry's families, with the labels ``label``
    gave the role (read at each scrape)."""

    def __init__(self, role: Role) -> None:
        super().__init__()
        self._role = role

    def collect(self) -> Iterator[Metric]:
        labels = _LABELS[self._role]
        for family in registry(self._role).collect():
            yield labelled(family, labels)

    def restricted_registry(self, names: Iterable[str]) -> RestrictedRegistry:
        return _RestrictedExport(names, self._role)


class _RestrictedExport(RestrictedRegistry):
    """``/metrics?name[]=...`` of an exported role: the series named, labelled the same."""

    def __init__(self, names: Iterable[str], role: Role) -> None:
        super().__init__(names, registry(role))
        self._role = role

    def collect(self) -> Iterator[Metric]:
        labels = _LABELS[self._role]
        for family in super().collect():
            yield labelled(family, labels)


def exported(role: Role) -> CollectorRegistry:
    """What a process of ``role`` exports: its registry, with the labels ``label`` gave it."""
    return _Export(role)


def serve(role: Role, port: int | None) -> None:
    """Serve ``role``'s metrics on ``port`` (nothing when it is None)."""
    if port is not None:
        start_http_server(port, registry=exported(role))


def exposition(role: Role) -> bytes:
    """``role``'s metrics in Prometheus' text format."""
    return generate_latest(exported(role))
