"""Each role's registry holds its own role's families and nothing of another role's."""

from __future__ import annotations

import pytest

# Every role's metrics defined, as in a process that imported them all.
import producers.metrics  # noqa: F401
import workers.metrics
import workers.webhooks.dispatch  # noqa: F401
from plumbing.metrics import ROLES, Role, exposition, registry
from schemas import constants as c
from schemas.webhooks import M_WEBHOOK_ATTEMPTS, M_WEBHOOK_FINISHED, M_WEBHOOK_OLDEST_DUE

SHARED = {c.M_RETRIES}
OWN: dict[Role, set[str]] = {
    "api": {
        c.M_AT_ONCE,
        c.M_JOINED,
        c.M_SUBMITTED,
        c.M_REFUSED,
        c.M_SUBMIT_GROUP,
        c.M_METERED,
        c.M_ADMISSIONS,
        c.M_BLOCKED,
        c.M_LAG,
        c.M_CONSUMER_LAG,
        c.M_LAG_KNOWN,
        c.M_LAG_READER,
        c.M_DRAIN_RATE,
        c.M_ARRIVAL_RATE,
        c.M_IN_FLIGHT,
        c.M_JOBS_BY_STATE,
        c.M_LATENCY_W,
        c.M_LITTLE_L,
    },
    "relay": {c.M_RELAY_PUBLISHED, c.M_RECONCILED, c.M_PRUNED},
    "worker": {
        c.M_AT_ONCE,
        c.M_JOINED,
        c.M_JOBS_STARTED,
        c.M_GRAPHS,
        c.M_GRAPH_CHUNKS,
        c.M_JOBS_FINISHED,
        c.M_JOBS_RUNNING,
        c.M_TOKENS_DECODED,
        c.M_JOB_SECONDS,
        c.M_DEAD_LETTERED,
        c.M_PAUSED_SECONDS,
        c.M_PARTITIONS,
        c.M_REVOKED,
        c.M_GENERATION,
        c.M_UNDER_RESERVED,
        c.M_DROPPED,
        c.M_ABORTED,
        c.M_WASTED_TOKENS,
        c.M_ABORT_SECONDS,
        c.M_KV_USAGE,
        c.M_KV_FREE,
        c.M_KV_RESERVED,
        c.M_PREEMPTIONS,
    },
    "webhooks": {M_WEBHOOK_ATTEMPTS, M_WEBHOOK_FINISHED, M_WEBHOOK_OLDEST_DUE, c.M_DEAD_LETTERED},
}


def families(role: Role) -> set[str]:
    """The sluicegate_* families of ``role`` as the exposition names them (a counter
    with its _total)."""
    names = set()
    for family in registry(role).collect():
        name = family.name + ("_total" if family.type == "counter" else "")
        if name.startswith("sluicegate_"):
            names.add(name)
    return names


@pytest.mark.parametrize("role", ROLES)
def test_a_role_exports_its_own_families_only(role: Role) -> None:
    assert families(role) == OWN[role] | SHARED


@pytest.mark.parametrize("role", ROLES)
def test_a_role_exports_the_process_metrics(role: Role) -> None:
    text = exposition(role).decode()
    assert "python_gc_objects_collected_total" in text
    assert "python_info" in text


def test_no_family_of_one_role_is_exported_by_another() -> None:
    for role in ROLES:
        others = set().union(*(OWN[o] for o in ROLES if o != role)) - OWN[role]
        assert not families(role) & others, role
