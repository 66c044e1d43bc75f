"""Ways to break a copy of the parsed files, for tests/unit/deploy/test_broken_copies.py:
each names the check it must make fail."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, NamedTuple

from tests.unit.deploy.files import Compose, Deploy
from tests.unit.deploy.metrics import exprs, panels

# What a broken file makes a check raise: a failed assertion or a missing/ill-typed key.
BROKEN = (AssertionError, LookupError, TypeError, ValueError)


def _parent(tree: dict[str, Any], path: str) -> tuple[Any, Any]:
    """The container holding the last key of a /-separated path (list indices as numbers)."""
    node: Any = tree
    keys: list[Any] = [int(k) if k.isdigit() else k for k in path.split("/")]
    for key in keys[:-1]:
        node = node[key]
    return node, keys[-1]


DROP = object()


def at(path: str, value: object = DROP) -> Callable[[Any], None]:
    """A breakage that sets the value at a /-separated path (services/kafka/image), or drops
    the key there."""

    def mutate(tree: Any) -> None:
        node, last = _parent(tree, path)
        if value is DROP:
            del node[last]
        else:
            node[last] = copy.deepcopy(value)

    return mutate


def edit(path: str, change: Callable[[Any], Any]) -> Callable[[Any], None]:
    def mutate(tree: Any) -> None:
        node, last = _parent(tree, path)
        node[last] = change(node[last])

    return mutate


def nginx(old: str, new: str) -> Callable[[Deploy], None]:
    """Rewrite a snippet of nginx.conf (it must be there, or the breakage would be void)."""

    def mutate(deploy: Deploy) -> None:
        assert old in deploy["nginx"], old
        deploy["nginx"] = deploy["nginx"].replace(old, new)

    return mutate


def gpu_twin(**device: object) -> Callable[[Compose], None]:
    """A second vLLM worker, reserving ``device``."""

    def mutate(compose: Compose) -> None:
        twin = copy.deepcopy(compose["services"]["worker"])
        twin["deploy"]["resources"]["reservations"]["devices"] = [
            {"driver": "nvidia", "capabilities": ["gpu"], **device}
        ]
        compose["services"]["worker-gpu1"] = twin

    return mutate


def first_panel(deploy: Deploy, metric: str) -> dict[str, Any]:
    return next(p for p in panels(deploy["dashboard"]) if any(metric in e for e in exprs(p)))


def panel_at(metric: str, key: str, value: object) -> Callable[[Deploy], None]:
    return lambda deploy: first_panel(deploy, metric).__setitem__(key, value)


def reword(metric: str, old: str, new: str) -> Callable[[Deploy], None]:
    """Rewrite the first query of the first panel that reads ``metric``."""

    def mutate(deploy: Deploy) -> None:
        target = first_panel(deploy, metric)["targets"][0]
        assert old in target["expr"], target["expr"]
        target["expr"] = target["expr"].replace(old, new)

    return mutate


class Breakage(NamedTuple):
    id: str
    check: Callable[[Any], None]
    mutate: Callable[[Any], None]
