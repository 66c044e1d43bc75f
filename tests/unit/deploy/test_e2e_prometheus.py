"""The Prometheus configuration tests/e2e/test_dashboard.py runs is the deploy one
(deploy/prometheus/prometheus.yml) with only the targets changed: every scrape job keeps its
name, path and relabelling, and the relabelling gives each target the ``service`` label it
gets in docker-compose."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.e2e.prometheus import DNS_NAME, scrape_config
from tests.unit.deploy.files import PROMETHEUS_FILE, parsed


def deploy() -> dict[str, Any]:
    loaded: dict[str, Any] = parsed(PROMETHEUS_FILE)
    return loaded


def targets_for(config: dict[str, Any]) -> dict[str, list[str]]:
    return {
        job["job_name"]: [f"127.0.0.1:{9000 + i}", f"127.0.0.1:{9100 + i}"]
        for i, job in enumerate(config["scrape_configs"])
    }


def relabelled(labels: dict[str, str], rules: list[dict[str, Any]]) -> dict[str, str]:
    """Prometheus' ``replace`` relabelling (the default action) of a target's labels, with
    the ``__`` labels dropped afterwards as Prometheus drops them."""
    labels = dict(labels)
    for rule in rules:
        assert rule.get("action", "replace") == "replace", rule
        value = rule.get("separator", ";").join(labels.get(s, "") for s in rule["source_labels"])
        match = re.fullmatch(rule.get("regex", "(.*)"), value)
        if match:
            replacement = re.sub(r"\$\{?(\d+)\}?", r"\\\1", rule.get("replacement", "$1"))
            labels[rule["target_label"]] = match.expand(replacement)
    return {k: v for k, v in labels.items() if not k.startswith("__")}


def test_every_job_keeps_its_name_path_and_relabelling() -> None:
    original = deploy()
    targets = targets_for(original)
    derived = scrape_config(original, targets)

    assert [j["job_name"] for j in derived["scrape_configs"]] == [
        j["job_name"] for j in original["scrape_configs"]
    ]
    for before, after in zip(original["scrape_configs"], derived["scrape_configs"], strict=True):
        name = before["job_name"]
        assert after.get("metrics_path") == before.get("metrics_path"), name
        assert after["relabel_configs"] == before["relabel_configs"], name
        assert "dns_sd_configs" not in after, name
        # Nothing else of the job changed.
        kept = {k: v for k, v in before.items() if k != "dns_sd_configs"}
        assert {k: v for k, v in after.items() if k != "static_configs"} == kept, name
        (group,) = after["static_configs"]
        assert group["targets"] == targets[name]
        # The label the DNS discovery sets: the (first) name the job looks up.
        assert group["labels"] == {DNS_NAME: before["dns_sd_configs"][0]["names"][0]}


def test_the_relabelling_gives_the_service_label_of_docker_compose() -> None:
    derived = scrape_config(deploy(), targets_for(deploy()))
    services = {
        job["job_name"]: relabelled(job["static_configs"][0]["labels"], job["relabel_configs"])
        for job in derived["scrape_configs"]
    }
    assert services == {
        "api": {"service": "api"},
        "relay": {"service": "relay"},
        "webhooks": {"service": "webhooks"},
        "worker": {"service": "worker"},
    }


def test_everything_is_scraped_and_evaluated_every_second() -> None:
    original = deploy()
    derived = scrape_config(original, targets_for(original))
    assert derived["global"] == {
        **original["global"],
        "scrape_interval": "1s",
        "scrape_timeout": "1s",
        "evaluation_interval": "1s",
    }
    assert set(derived) == set(original)


def test_the_deploy_config_is_left_as_it_was() -> None:
    original = deploy()
    copy = deploy()
    scrape_config(original, targets_for(original))
    assert original == copy


def test_a_job_without_targets_is_refused() -> None:
    original = deploy()
    targets = targets_for(original)
    del targets["relay"]
    with pytest.raises(ValueError, match="scrape jobs"):
        scrape_config(original, targets)
