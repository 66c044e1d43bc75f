"""The worker pools: one per model served, each with its own dispatch topic, consumer group
and settings (``SLUICEGATE_POOLS``; docs/models.md).

Without pools configured there is one pool, as before pools: it serves every name of
``models`` on ``dispatch_topic`` and ``consumer_group``. With pools, the first keeps those
two names (a deployment that had one model upgrades with nothing to move) and every other
gets ``<dispatch_topic>.<model>`` and ``<consumer_group>.<model>`` unless its settings name
others.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from plumbing.settings import Settings

_NOT_IN_A_TOPIC = re.compile(r"[^a-zA-Z0-9._-]")


@dataclass(frozen=True)
class Pool:
    """One model's pool. ``settings`` are the whole settings with the pool's own applied
    (its topic and group included); ``first`` is the pool that keeps the legacy names (jobs
    stored before pools belong to it)."""

    model: str
    names: tuple[str, ...]
    settings: Settings
    first: bool

    @property
    def topic(self) -> str:
        return self.settings.dispatch_topic

    @property
    def group(self) -> str:
        return self.settings.consumer_group


def slug(model: str) -> str:
    """``model`` as a part of a topic's name (Kafka allows letters, digits, ``._-``)."""
    return _NOT_IN_A_TOPIC.sub("_", model)


class Pools:
    """Every pool of ``settings``, in the order they are configured."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        if not settings.pools:
            names = tuple(settings.models)
            self._pools = [Pool(names[0], names, settings, first=True)]
        else:
            self._pools = [_pool(settings, model, i == 0) for i, model in enumerate(settings.pools)]
        topics = [p.topic for p in self._pools]
        if len(set(topics)) != len(topics):
            raise ValueError(f"pools: two pools share a dispatch topic: {topics}")
        self._by_name = {name: p for p in self._pools for name in p.names}

    def __iter__(self) -> Iterator[Pool]:
        return iter(self._pools)

    def __len__(self) -> int:
        return len(self._pools)

    @property
    def first(self) -> Pool:
        return self._pools[0]

    def of(self, model: str | None) -> Pool:
        """The pool serving ``model`` (the first for None). A name no pool serves is
        refused before this is asked (404 ``model_not_found``); it gets the first too."""
        return self._by_name.get(model, self._pools[0]) if model else self._pools[0]

    def topic_of(self, model: str | None) -> str:
        """The dispatch topic of the pool serving ``model``."""
        return self.of(model).topic

    def for_worker(self) -> Pool:
        """The pool a worker of these settings joins (``worker_model``)."""
        model = self._settings.worker_model
        if model is None:
            return self._pools[0]
        found = self._by_name.get(model)
        if found is None:
            raise ValueError(f"worker_model {model!r} is served by no pool")
        return found

    def topic_partitions(self) -> dict[str, int]:
        """Every topic the pipeline uses, with its partitions: each pool's dispatch topic."""
        topics = dict(self._settings.topic_partitions())
        for p in self._pools:
            topics[p.topic] = p.settings.partitions
        return topics

    def topics(self) -> frozenset[str]:
        """Every pool's dispatch topic."""
        return frozenset(p.topic for p in self._pools)


def _pool(settings: Settings, model: str, first: bool) -> Pool:
    own = dict(settings.pools[model])
    if not first:
        own.setdefault("dispatch_topic", f"{settings.dispatch_topic}.{slug(model)}")
        own.setdefault("consumer_group", f"{settings.consumer_group}.{slug(model)}")
    values = {name: getattr(settings, name) for name in type(settings).model_fields}
    pooled = Settings.model_validate({**values, **own, "worker_model": model})
    return Pool(model, (model,), pooled, first)
