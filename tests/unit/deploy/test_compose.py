"""The real docker-compose.yml, deploy/, Dockerfile and .dockerignore pass every check; the
compose file meets the Compose Specification; the PromQL reading and the metric catalog are
right."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from schemas import constants
from tests.unit.deploy.compose_checks import COMPOSE_CHECKS, check_dockerfile, check_dockerignore
from tests.unit.deploy.deploy_checks import DEPLOY_CHECKS
from tests.unit.deploy.files import (
    ALERTS_FILE,
    COMPOSE_FILE,
    DOCKERFILE,
    DOCKERIGNORE,
    Compose,
    Deploy,
    load_compose,
    load_deploy,
)
from tests.unit.deploy.metrics import (
    all_values,
    always_labelled,
    exported_series,
    grafana_query,
    promql_grouping,
    promql_matchers,
    promql_metrics,
    promql_selectors,
    selects_by,
)


@pytest.mark.parametrize("check", COMPOSE_CHECKS, ids=lambda check: check.__name__)
def test_compose_file(check: Callable[[Compose], None]) -> None:
    check(load_compose())


@pytest.mark.parametrize("check", DEPLOY_CHECKS, ids=lambda check: check.__name__)
def test_deploy_files(check: Callable[[Deploy], None]) -> None:
    check(load_deploy())


def test_no_zookeeper_anywhere() -> None:
    assert "zookeeper" not in COMPOSE_FILE.read_text().lower()


def test_dockerfile() -> None:
    check_dockerfile(DOCKERFILE.read_text())


def test_dockerignore() -> None:
    check_dockerignore(DOCKERIGNORE.read_text())


def test_compose_spec_schema() -> None:
    """The compose file against the Compose Specification's JSON schema, as vendored by
    check-jsonschema (nothing is downloaded; skipped where it is not installed)."""
    jsonschema = pytest.importorskip("jsonschema")
    # The package's file, not the package: importing it loads its CLI, which needs a newer
    # click than schemathesis allows.
    spec = importlib.util.find_spec("check_jsonschema")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("check-jsonschema is not installed")
    vendor = Path(next(iter(spec.submodule_search_locations))) / "builtin_schemas" / "vendor"
    schema = json.loads((vendor / "compose-spec.json").read_text())
    validator = jsonschema.validators.validator_for(schema)(schema)
    compose = load_compose()
    assert not [error.message for error in validator.iter_errors(compose)]
    compose["services"]["api"]["stop_grace"] = "30s"  # no such key: the schema must notice
    assert list(validator.iter_errors(compose))


@pytest.mark.parametrize(
    ("expr", "metrics", "grouping"),
    [
        ("max(sluicegate_lag_records)", {"sluicegate_lag_records"}, set()),
        (
            'sum by (outcome, reason) (rate(x_total{job="api", code=~"4.."}[$__rate_interval]))',
            {"x_total"},
            {"outcome", "reason"},
        ),
        (
            "histogram_quantile(0.99, sum by (le) (rate(a_bucket[5m] offset 1h))) > 1e3",
            {"a_bucket"},
            {"le"},
        ),
        (
            "a / on (instance) group_left (service) b:rate5m",
            {"a", "b:rate5m"},
            {"instance", "service"},
        ),
        (
            'sum(rate(vllm:kv_cache_usage_perc{model_name="m"}[1m])) without (engine)',
            {"vllm:kv_cache_usage_perc"},
            {"engine"},
        ),
    ],
)
def test_promql_reading(expr: str, metrics: set[str], grouping: set[str]) -> None:
    assert promql_metrics(expr) == metrics
    assert promql_grouping(expr) == grouping


def test_the_metric_catalog_is_the_codes() -> None:
    series = exported_series()
    assert series[constants.M_ADMISSIONS] == {"outcome", "reason", "model"}
    assert constants.M_JOB_SECONDS + "_bucket" in series
    assert constants.M_LAG in series
    assert "sluicegate_webhook_attempts_total" in series  # workers/webhooks/dispatch.py
    assert not any(name.startswith("vllm:") for name in series)


def test_a_query_as_grafana_sends_it() -> None:
    dashboard = load_deploy()["dashboard"]
    values = {**all_values(dashboard), "__rate_interval": "5m"}
    assert values["model"] == ".*"
    expr = 'sum by (model) (rate(a_total{model=~"$model", b=~"${model}"}[$__rate_interval]))'
    assert grafana_query(expr, values) == (
        'sum by (model) (rate(a_total{model=~".*", b=~".*"}[5m]))'
    )
    assert grafana_query('a{x=~"$models"}[${__rate_interval}]', values) == 'a{x=~"$models"}[5m]'


def test_the_matchers_of_an_expression() -> None:
    expr = 'a{job="api", code=~"4..", m=~"${model}"} / b{x!="y\\"z"} + c{z!~"q"}[5m]'
    assert promql_matchers(expr) == [
        ("job", "=", "api"),
        ("code", "=~", "4.."),
        ("m", "=~", "${model}"),
        ("x", "!=", 'y\\"z'),
        ("z", "!~", "q"),
    ]


def test_the_selectors_of_a_metric() -> None:
    expr = 'a{model=~"$model"} / on (model) a_b{model=~"$model"} + a + a{x="y", model=~"${model}"}'
    found = promql_selectors(expr, "a")
    assert found == ['model=~"$model"', "", 'x="y", model=~"${model}"']
    assert [selects_by(m, "model", "model") for m in found] == [True, False, True]
    assert not selects_by('model="$model"', "model", "model")
    assert not selects_by('model=~"$models"', "model", "model")


def test_a_worker_family_carries_its_pool_model() -> None:
    """plumbing.metrics.label gives the worker's families ``model`` as they are exported."""
    series = exported_series()
    assert "model" in series[constants.M_JOBS_STARTED]
    assert series[constants.M_JOB_SECONDS + "_bucket"] >= {"le", "model"}
    labelled = always_labelled("model")
    assert constants.M_KV_USAGE in labelled
    # The dead letters: a worker's carry the model, the webhook dispatcher's do not.
    assert "model" in series[constants.M_DEAD_LETTERED]
    assert constants.M_DEAD_LETTERED not in labelled
    assert constants.M_RELAY_PUBLISHED not in labelled


@pytest.mark.skipif(shutil.which("promtool") is None, reason="no promtool (Debian's prometheus)")
def test_promtool_accepts_the_alert_rules() -> None:
    checked = subprocess.run(
        ["promtool", "check", "rules", str(ALERTS_FILE)], capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
