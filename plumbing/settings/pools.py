"""Settings of the models served: one worker pool per model, each with its own dispatch
topic, consumer group, lag, admission and capacity (``plumbing.pools`` resolves them)."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field

from plumbing.settings.base import SettingsGroup


class PoolSettings(SettingsGroup):
    """The models the deployment serves, a worker pool each (docs/models.md)."""

    title: ClassVar[str] = "Models and pools"
    path: ClassVar[str] = "pool"

    pools: dict[str, dict[str, Any]] = Field(
        default={},
        description="One worker pool per model: a JSON object of model name → that pool's "
        'settings where they differ from the others, e.g. `{"alpha": {}, "beta": '
        '{"lag_hard": 500, "sim_time_scale": 2}}`. The first pool keeps `dispatch_topic` '
        "and `consumer_group`; every other one gets `<dispatch_topic>.<model>` and "
        "`<consumer_group>.<model>` unless its settings name others. Its models are the "
        "names a request may give (`models` is then theirs). Empty: one pool, serving every "
        "name of `models`.",
    )
    worker_model: str | None = Field(
        default=None,
        description="The model a worker serves: the pool it joins (its topic, its group, "
        "its settings). Unset: the first pool.",
    )
