"""Every check of deploy/ (the gateway, Prometheus and Grafana) rejects a copy of the files
broken in the way it guards against, so that none can pass vacuously."""

from __future__ import annotations

import copy

import pytest

from schemas import constants
from tests.unit.deploy.breaking import (
    BROKEN,
    Breakage,
    at,
    edit,
    first_panel,
    nginx,
    panel_at,
    reword,
)
from tests.unit.deploy.deploy_checks import (
    DEPLOY_CHECKS,
    check_alert_rules,
    check_dashboard_metrics,
    check_dashboard_models,
    check_dashboard_panels,
    check_gateway,
    check_grafana,
    check_prometheus_targets,
)
from tests.unit.deploy.files import load_deploy

S = "services"
SCRAPE = "prometheus/scrape_configs"
RULE = "alerts/groups/0/rules/0"
MODEL_PICKED = '{model=~"$model"}'
BREAKAGES = [
    Breakage(
        "nginx before resolve", check_gateway, at(f"compose/{S}/gateway/image", "nginx:1.26.3")
    ),
    Breakage("gateway on 8080", check_gateway, at(f"compose/{S}/gateway/ports", ["8080:8000"])),
    Breakage("upstream on 8080", check_gateway, nginx("api:8000 resolve;", "api:8080 resolve;")),
    Breakage("upstream resolved once", check_gateway, nginx("api:8000 resolve;", "api:8000;")),
    Breakage(
        "batches refused by nginx",
        check_gateway,
        nginx("client_max_body_size 136m;", "client_max_body_size 1m;"),
    ),
    Breakage(
        "long-polls cut",
        check_gateway,
        nginx("proxy_read_timeout 90s;", "proxy_read_timeout 60s;"),
    ),
    Breakage(
        "bodies spooled",
        check_gateway,
        nginx("proxy_request_buffering off;", "proxy_request_buffering on;"),
    ),
    Breakage(
        "relay scraped on the wrong port",
        check_prometheus_targets,
        at(f"{SCRAPE}/1/dns_sd_configs/0/port", 9200),
    ),
    Breakage(
        "a target that is no service",
        check_prometheus_targets,
        at(f"{SCRAPE}/3/dns_sd_configs/0/names", ["workers"]),
    ),
    Breakage("webhooks never scraped", check_prometheus_targets, at(f"{SCRAPE}/2")),
    Breakage("api metrics path", check_prometheus_targets, at(f"{SCRAPE}/0/metrics_path", "/x")),
    Breakage(
        "api scraped on a metrics port it lacks",
        check_prometheus_targets,
        at(f"{SCRAPE}/0", {"job_name": "api", "static_configs": [{"targets": ["api:9100"]}]}),
    ),
    Breakage(
        "prometheus reads another file",
        check_prometheus_targets,
        at(f"compose/{S}/prometheus/volumes/0", "./deploy/prometheus:/etc/x"),
    ),
    Breakage(
        "data source on localhost",
        check_grafana,
        at("datasources/datasources/0/url", "http://localhost:9090"),
    ),
    Breakage(
        "dashboards looked for elsewhere",
        check_grafana,
        at("providers/providers/0/options/path", "/var/lib/grafana/dashboards"),
    ),
    Breakage(
        "panel on another data source",
        check_grafana,
        panel_at(constants.M_LAG, "datasource", {"uid": "prom"}),
    ),
    Breakage(
        "metric no code exports",
        check_dashboard_metrics,
        reword(constants.M_LAG, constants.M_LAG, "sluicegate_lag"),
    ),
    Breakage(
        "vLLM's old metric name",
        check_dashboard_metrics,
        reword(constants.M_KV_USAGE, constants.M_KV_USAGE, "vllm:gpu_cache_usage_perc"),
    ),
    Breakage(
        "grouped by a label the metric lacks",
        check_dashboard_metrics,
        reword(constants.M_DROPPED, "by (model, reason)", "by (model, cause)"),
    ),
    Breakage(
        "a job that is not scraped",
        check_dashboard_metrics,
        reword(constants.M_LAG, constants.M_LAG, constants.M_LAG + '{job="apis"}'),
    ),
    Breakage(
        "a model picked from a family without one",
        check_dashboard_metrics,
        reword(constants.M_REFUSED, constants.M_REFUSED, constants.M_REFUSED + MODEL_PICKED),
    ),
    Breakage(
        "no drops panel",
        check_dashboard_panels,
        lambda d: d["dashboard"]["panels"].remove(first_panel(d, constants.M_DROPPED)),
    ),
    Breakage(
        "admission not broken out by reason",
        check_dashboard_panels,
        reword(constants.M_ADMISSIONS, "by (model, outcome, reason)", "by (model, outcome)"),
    ),
    Breakage(
        "lag of every model in one line",
        check_dashboard_panels,
        reword(constants.M_LAG, "max by (model)", "max"),
    ),
    Breakage("no model variable", check_dashboard_models, at("dashboard/templating/list", [])),
    Breakage(
        "one model at a time",
        check_dashboard_models,
        at("dashboard/templating/list/0/multi", False),
    ),
    Breakage(
        "All leaves out the series without a model",
        check_dashboard_models,
        at("dashboard/templating/list/0/allValue"),
    ),
    Breakage(
        "models read from a family without them",
        check_dashboard_models,
        at(
            "dashboard/templating/list/0/query/query",
            "label_values(sluicegate_jobs_submitted_total, model)",
        ),
    ),
    Breakage(
        "lag of every model whatever is picked",
        check_dashboard_models,
        reword(constants.M_LAG, MODEL_PICKED, ""),
    ),
    Breakage(
        "KV usage of every model whatever is picked",
        check_dashboard_models,
        reword(constants.M_KV_USAGE, MODEL_PICKED, '{model=~".*"}'),
    ),
    Breakage(
        "variable on another data source",
        check_grafana,
        at("dashboard/templating/list/0/datasource/uid", "prom"),
    ),
    Breakage("repeated panel id", check_dashboard_panels, panel_at(constants.M_KV_USAGE, "id", 1)),
    Breakage("alerts never loaded", check_alert_rules, at("prometheus/rule_files", [])),
    Breakage(
        "alerts not mounted",
        check_alert_rules,
        edit(f"compose/{S}/prometheus/volumes", lambda v: [m for m in v if "alerts" not in m]),
    ),
    Breakage(
        "an alert on a metric no code exports",
        check_alert_rules,
        at(f"{RULE}/expr", "max(sluicegate_webhook_oldest_due) > 60"),
    ),
    Breakage(
        "an alert grouped by a label the metric lacks",
        check_alert_rules,
        at(f"{RULE}/expr", "max by (endpoint) (sluicegate_webhook_oldest_due_seconds) > 60"),
    ),
    Breakage("an alert that fires on one evaluation", check_alert_rules, at(f"{RULE}/for", "0s")),
    Breakage(
        "an alert over another threshold than the overview's",
        check_alert_rules,
        at(f"{RULE}/expr", "max by (instance) (sluicegate_webhook_oldest_due_seconds) > 120"),
    ),
    Breakage("an alert without a severity", check_alert_rules, at(f"{RULE}/labels")),
    Breakage("no alert of deliveries waiting", check_alert_rules, at("alerts/groups/0/rules", [])),
]


@pytest.mark.parametrize("breakage", BREAKAGES, ids=lambda b: b.id)
def test_broken_files_are_rejected(breakage: Breakage) -> None:
    files = load_deploy()
    breakage.check(copy.deepcopy(files))  # passes on the real files...
    breakage.mutate(files)
    with pytest.raises(BROKEN):  # ...and fails on the broken ones
        breakage.check(files)


def test_every_check_has_a_breakage() -> None:
    assert {b.check for b in BREAKAGES} == set(DEPLOY_CHECKS)
