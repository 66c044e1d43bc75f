"""The checks of deploy/: the gateway, Prometheus and Grafana against the compose file and the
code."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

from producers.api.overview import BEHIND_S
from schemas import constants, webhooks
from tests.unit.deploy.files import (
    ALERTS_FILE,
    DASHBOARD_FILE,
    GRAFANA,
    NGINX_FILE,
    PROMETHEUS_FILE,
    Deploy,
    bind_mounts,
    env,
    long_running,
    metrics_port,
    nginx_directives,
    nginx_size,
    nginx_uncommented,
    seconds,
    settings_of,
)
from tests.unit.deploy.metrics import (
    PROMETHEUS_SERIES,
    always_labelled,
    exported_series,
    exprs,
    panels,
    promql_grouping,
    promql_matchers,
    promql_metrics,
    promql_selectors,
    scrape_targets,
    selects_by,
    target_labels,
    variables,
)

# The checks of deploy/: the gateway, Prometheus and Grafana against the compose file and code


def check_gateway(deploy: Deploy) -> None:
    """nginx publishes the API port, finds every API replica in Docker's DNS, and lets the
    API's own limits answer first."""
    services = deploy["compose"]["services"]
    gateway, api = services["gateway"], services["api"]
    version = re.fullmatch(r"nginx:(\d+)\.(\d+)\.(\d+)(-alpine)?", gateway["image"])
    assert version, gateway["image"]
    assert tuple(map(int, version.groups()[:3])) >= (1, 27, 3), "`resolve` needs nginx 1.27.3"
    assert bind_mounts(gateway)["/etc/nginx/nginx.conf"] == NGINX_FILE
    settings, port = settings_of(api), metrics_port(api)
    assert f"{port}:{port}" in [str(p) for p in gateway["ports"]], gateway["ports"]
    found: dict[str, list[list[str]]] = {}
    for name, args in nginx_directives(deploy["nginx"]):
        found.setdefault(name, []).append(args)
    assert found["resolver"][0][0] == "127.0.0.11", "not Docker's DNS"
    assert [str(port)] in found["listen"]
    assert ["api:" + str(port), "resolve"] in found["server"], "no upstream of every API replica"
    assert "zone" in found, "`resolve` needs a shared zone"
    upstream = re.search(
        r"upstream\s+(\w+)\s*\{[^}]*\bserver\s+api:", nginx_uncommented(deploy["nginx"])
    )
    assert upstream, "the API replicas are no upstream"
    assert [f"http://{upstream.group(1)}"] in found["proxy_pass"]
    body = nginx_size(found["client_max_body_size"][0][0])
    assert body > settings.max_batch_bytes, "a batch the API takes is refused by nginx"
    assert seconds(found["proxy_read_timeout"][0][0]) > settings.max_wait_s, "?wait= is cut"
    assert ["off"] in found["proxy_request_buffering"], "bodies are spooled, not streamed"


def check_prometheus_targets(deploy: Deploy) -> None:
    """Prometheus reads this file, scrapes each Sluicegate process on its metrics port, and
    scrapes every one of them."""
    services = deploy["compose"]["services"]
    prometheus = services["prometheus"]
    config = [arg.split("=", 1)[1] for arg in prometheus["command"] if "--config.file=" in arg]
    assert bind_mounts(prometheus)[config[0]] == PROMETHEUS_FILE
    jobs = [job["job_name"] for job in deploy["prometheus"]["scrape_configs"]]
    assert len(jobs) == len(set(jobs)), f"duplicate jobs: {jobs}"
    scraped = set()
    for job, path, host, port in scrape_targets(deploy["prometheus"]):
        assert host in services, f"{job}: {host} is no service"
        assert port == metrics_port(services[host]), f"{job}: {host} serves metrics elsewhere"
        assert path == "/metrics", f"{job}: {path}"
        scraped.add(host)
    missing = set(long_running(deploy["compose"])) - scraped
    assert not missing, f"never scraped: {sorted(missing)}"
    glob = deploy["prometheus"]["global"]
    assert seconds(glob["scrape_timeout"]) < seconds(glob["scrape_interval"])


def check_grafana(deploy: Deploy) -> None:
    """Grafana provisions the Prometheus data source and the dashboard from deploy/grafana."""
    services = deploy["compose"]["services"]
    grafana = services["grafana"]
    binds = bind_mounts(grafana)
    assert binds["/etc/grafana/provisioning"] == (GRAFANA / "provisioning")
    (source,) = deploy["datasources"]["datasources"]
    assert source["type"] == "prometheus"
    url = urlsplit(source["url"])
    assert url.hostname in services, f"{url.hostname} is no service"
    assert url.port == 9090, "Prometheus listens on 9090"
    assert "--web.listen-address" not in " ".join(services[url.hostname]["command"])
    (provider,) = deploy["providers"]["providers"]
    assert binds[provider["options"]["path"]] == DASHBOARD_FILE.parent, "no dashboards there"
    home = Path(env(grafana)["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"])
    assert binds[str(home.parent)] / home.name == DASHBOARD_FILE
    for panel in panels(deploy["dashboard"]):
        if panel["type"] == "row":
            continue
        uids = {panel["datasource"]["uid"]} | {
            target["datasource"]["uid"] for target in panel["targets"] if "datasource" in target
        }
        assert uids == {source["uid"]}, f"{panel['title']}: data source {uids}"
    for name, variable in variables(deploy["dashboard"]).items():
        assert variable["datasource"]["uid"] == source["uid"], f"${name}: another data source"


def _check_expr(deploy: Deploy, where: str, expr: str) -> None:
    """``expr`` reads series the code exports (or Prometheus's own ``up``), grouped and
    matched by labels they have, from jobs that exist."""
    series = exported_series() | PROMETHEUS_SERIES
    on_target = target_labels(deploy["prometheus"])
    jobs = {job["job_name"] for job in deploy["prometheus"]["scrape_configs"]}
    names = promql_metrics(expr)
    assert names, f"{where}: {expr} reads no metric"
    unknown = names - set(series)
    assert not unknown, f"{where}: no code exports {sorted(unknown)}"
    labels = on_target.union(*(series[name] for name in names))
    assert promql_grouping(expr) <= labels, f"{where}: {expr}"
    for label, operator, value in promql_matchers(expr):
        assert label in labels, f"{where}: no label {label}"
        if label == "job" and operator == "=":
            assert value in jobs, f"{where}: no job {value}"


def check_dashboard_metrics(deploy: Deploy) -> None:
    """Every series the dashboard reads is one the code exports (or Prometheus's own ``up``),
    grouped by labels it has, from jobs that exist."""
    for panel in panels(deploy["dashboard"]):
        for expr in exprs(panel):
            _check_expr(deploy, panel["title"], expr)


# The alerts deploy/prometheus/alerts.yml must have, and a series each must read.
REQUIRED_ALERTS = {"SluicegateWebhooksBehind": webhooks.M_WEBHOOK_OLDEST_DUE}
# The threshold of an alert that the API's overview judges by too (its ``behind``).
SHARED_THRESHOLDS = {"SluicegateWebhooksBehind": BEHIND_S}


def check_alert_rules(deploy: Deploy) -> None:
    """Prometheus loads alerts.yml, mounted beside its configuration; every alert reads
    series the code exports, waits a while before it fires, says how severe it is and what
    happened; the required alerts are there."""
    prometheus = deploy["compose"]["services"]["prometheus"]
    config = [arg.split("=", 1)[1] for arg in prometheus["command"] if "--config.file=" in arg]
    binds = bind_mounts(prometheus)
    loaded = [
        binds.get(str(Path(config[0]).parent / name)) for name in deploy["prometheus"]["rule_files"]
    ]
    assert loaded == [ALERTS_FILE], f"Prometheus loads {loaded}"
    alerts = {}
    for group in deploy["alerts"]["groups"]:
        for rule in group["rules"]:
            name = rule["alert"]
            _check_expr(deploy, name, rule["expr"])
            assert seconds(rule["for"]) > 0, f"{name} fires on one evaluation"
            assert rule["labels"]["severity"] in {"warning", "critical"}, name
            assert rule["annotations"]["summary"], name
            alerts[name] = rule["expr"]
    for name, metric in REQUIRED_ALERTS.items():
        assert name in alerts, f"no alert {name}"
        assert metric in promql_metrics(alerts[name]), f"{name} does not read {metric}"
    for name, threshold in SHARED_THRESHOLDS.items():
        found = re.search(r">\s*([0-9.]+)\s*$", alerts.get(name, "").strip())
        assert found, f"{name} is no threshold"
        assert float(found.group(1)) == threshold, f"{name} not over {threshold}"


# The panels the dashboard must have: the series they read and the labels they break out.
REQUIRED_PANELS = {
    "consumer-group lag": ({constants.M_LAG}, {"model"}),
    "arrival rate λ": ({constants.M_ARRIVAL_RATE}, {"model"}),
    "latency W": ({constants.M_LATENCY_W}, set()),
    "λ·W beside the jobs in flight": ({constants.M_LITTLE_L, constants.M_IN_FLIGHT}, set()),
    "jobs not ended by state": ({constants.M_JOBS_BY_STATE}, {"state", "model"}),
    "KV cache usage": ({constants.M_KV_USAGE}, {"model"}),
    "admission decisions": ({constants.M_ADMISSIONS}, {"outcome", "reason", "model"}),
    "drops before decode": ({constants.M_DROPPED}, {"reason", "model"}),
}


def check_dashboard_panels(deploy: Deploy) -> None:
    dashboard = deploy["dashboard"]
    assert dashboard["uid"], "no uid: a provisioned dashboard would change address"
    ids = [panel["id"] for panel in panels(dashboard)]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    for panel in panels(dashboard):
        box = panel["gridPos"]
        assert box["x"] + box["w"] <= 24, f"{panel['title']} is wider than the dashboard"
    for need, (names, labels) in REQUIRED_PANELS.items():
        assert any(
            names <= set().union(*map(promql_metrics, exprs(panel)))
            and labels <= set().union(*map(promql_grouping, exprs(panel)))
            for panel in panels(dashboard)
        ), f"no panel of {need}"


# The label of a worker pool's series (its model), and the dashboard's variable that picks them.
MODEL = "model"


def check_dashboard_models(deploy: Deploy) -> None:
    """The dashboard shows the models its variable ``model`` picks (several, or All: every
    series, those without the label too), reading the models from series that carry the
    label. Every query of a family that carries ``model`` wherever it is exported keeps only
    the models picked, unless it reads a family without the label too: a figure of the whole
    pipeline, such as λ·W from the submits and the latencies."""
    dashboard = deploy["dashboard"]
    variable = variables(dashboard)[MODEL]
    assert variable["type"] == "query", variable["type"]
    assert variable["multi"], "one model at a time"
    assert variable["includeAll"], "no All"
    assert variable["allValue"] == ".*", "All must match every series, those without a model"
    query = variable["query"]
    query = str(query["query"] if isinstance(query, dict) else query)
    found = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", query.strip())
    assert found, f"${MODEL}: {query}"
    assert found.group(2) == MODEL, f"${MODEL} lists {found.group(2)}"
    named = promql_metrics(found.group(1)) | {
        name
        for names in re.findall(r'__name__\s*=~?\s*"([^"]*)"', found.group(1))
        for name in names.split("|")
    }
    series = exported_series()
    assert named, f"${MODEL} reads no metric"
    for name in named:
        assert MODEL in series.get(name, ()), f"${MODEL} reads {name}, which has no {MODEL}"
    labelled = always_labelled(MODEL)
    for panel in panels(dashboard):
        for expr in exprs(panel):
            names = promql_metrics(expr)
            if any(MODEL not in series.get(name, ()) for name in names):
                continue  # a figure of the whole pipeline
            for name in names & labelled:
                for matchers in promql_selectors(expr, name):
                    assert selects_by(matchers, MODEL, MODEL), (
                        f"{panel['title']}: {expr} shows every model, not ${MODEL}'s"
                    )


DEPLOY_CHECKS: list[Callable[[Deploy], None]] = [
    check_gateway,
    check_prometheus_targets,
    check_grafana,
    check_dashboard_metrics,
    check_dashboard_panels,
    check_dashboard_models,
    check_alert_rules,
]
