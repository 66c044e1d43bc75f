"""The pools: one per model, their topics, groups and own settings."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from plumbing.pools import Pools
from plumbing.settings import Settings
from schemas import constants


def test_without_pools_one_pool_serves_every_name_on_the_legacy_topic_and_group() -> None:
    settings = Settings(models=["sim", "my-model"])
    pools = Pools(settings)
    assert len(pools) == 1
    pool = pools.first
    assert (pool.topic, pool.group) == (constants.DISPATCH_TOPIC, constants.WORKER_GROUP)
    assert pools.of("my-model") is pool
    assert pools.of(None) is pool
    assert pools.for_worker() is pool


def test_each_pool_has_its_topic_group_and_settings_the_first_keeps_the_legacy_names() -> None:
    settings = Settings(
        pools={"alpha": {}, "org/beta": {"lag_hard": 50, "partitions": 2, "sim_time_scale": 3}}
    )
    assert settings.models == ["alpha", "org/beta"]  # the names a request may give
    alpha, beta = Pools(settings)
    assert (alpha.topic, alpha.group) == (constants.DISPATCH_TOPIC, constants.WORKER_GROUP)
    assert alpha.first
    assert not beta.first
    assert beta.topic == f"{constants.DISPATCH_TOPIC}.org_beta"
    assert beta.group == f"{constants.WORKER_GROUP}.org_beta"
    assert (beta.settings.lag_hard, beta.settings.partitions) == (50, 2)
    assert beta.settings.sim_time_scale == 3
    assert alpha.settings.lag_hard == settings.lag_hard
    assert Pools(settings).topic_partitions()[beta.topic] == 2
    worker = Settings(pools=settings.pools, worker_model="org/beta")
    assert Pools(worker).for_worker().topic == beta.topic


def test_a_pool_may_name_its_own_topic_and_group() -> None:
    settings = Settings(pools={"a": {}, "b": {"dispatch_topic": "b.jobs", "consumer_group": "bw"}})
    _, b = Pools(settings)
    assert (b.topic, b.group) == ("b.jobs", "bw")


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ({"pools": {"a": {"lag_hrd": 1}}}, "sets lag_hrd"),
        ({"pools": {"a": {"database_url": "x"}}}, "sets database_url"),
        ({"pools": {"a": {"kafka_bootstrap_servers": "k:9092"}}}, "sets kafka_bootstrap_servers"),
        ({"pools": {"a": {}}, "worker_model": "b"}, "worker_model 'b' is not one of the pools"),
        ({"pools": {"a": {"lag_hard": "many"}}}, "lag_hard"),
        ({"pools": {"a": {"partitions": 0}}}, "the pool of 'a': partitions"),
    ],
)
def test_a_wrong_pool_is_refused_with_what_is_wrong(given: dict[str, object], says: str) -> None:
    with pytest.raises((ValidationError, ValueError), match=says):
        Pools(Settings.model_validate(given))


def test_two_pools_on_one_topic_are_refused() -> None:
    settings = Settings(pools={"a": {}, "b": {"dispatch_topic": constants.DISPATCH_TOPIC}})
    with pytest.raises(ValueError, match="share a dispatch topic"):
        Pools(settings)
