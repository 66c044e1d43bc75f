"""The metrics the code defines, and the ones a PromQL expression, a scrape config and a
dashboard read."""

from __future__ import annotations

import functools
import importlib
import re
from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client.metrics import MetricWrapperBase

from plumbing.metrics import CONSTANT_LABELS, PREFIX, ROLES, registry
from tests.unit.deploy.files import ROOT

# Series names of one metric, by type, as the exposition format writes them.
SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "summary": ("", "_count", "_sum", "_created"),
    "info": ("_info",),
    "stateset": ("",),
    "enum": ("",),
}
# A module defines metrics when it calls one of these (an alias such as MetricCounter too).
METRIC_CLASSES = r"(Counter|Gauge|Histogram|Summary|Info|Enum)\("
# Series Prometheus writes itself for every target.
PROMETHEUS_SERIES = {"up": frozenset[str]()}


@functools.cache
def _definitions() -> tuple[tuple[str, frozenset[str]], ...]:
    """(series name, label names) of every metric defined at module level by every module of
    ours that uses prometheus_client, one row per definition (a family that two roles define
    has a row of each). A family carries the labels its role's process adds to it as well
    (``plumbing.metrics.label``: a worker's pool model)."""
    found = []
    for room in ("producers", "workers", "sluicegate"):
        for path in sorted((ROOT / room).rglob("*.py")):
            text = path.read_text()
            if "prometheus_client" not in text or not re.search(METRIC_CLASSES, text):
                continue
            module = importlib.import_module(".".join(path.relative_to(ROOT).with_suffix("").parts))
            for metric in vars(module).values():
                if not isinstance(metric, MetricWrapperBase):
                    continue
                # prometheus_client keeps a counter's name without its _total.
                name, kind = metric._name, str(metric._type)
                labels = frozenset(metric._labelnames) | added_labels(metric)
                for suffix in SUFFIXES[kind]:
                    bucket = {"le"} if suffix == "_bucket" else set()
                    found.append((name + suffix, labels | bucket))
    return tuple(found)


def added_labels(metric: MetricWrapperBase) -> frozenset[str]:
    """The labels the process adds to ``metric`` as it exports it: those of the roles whose
    registry holds it, for our families."""
    if not metric._name.startswith(PREFIX):
        return frozenset()
    return frozenset().union(
        *(CONSTANT_LABELS[role] for role in ROLES if metric in registry(role)._collector_to_names)
    )


def exported_series() -> dict[str, frozenset[str]]:
    """Every series name the Sluicegate processes can export, with every label name it may
    carry."""
    found: dict[str, frozenset[str]] = {}
    for name, labels in _definitions():
        found[name] = found.get(name, frozenset()) | labels
    return found


def always_labelled(label: str) -> set[str]:
    """The series that carry ``label`` wherever they are exported (the dead letters, which a
    worker and the webhook dispatcher both export, only if both give it)."""
    definitions = _definitions()
    return {name for name, _ in definitions} - {
        name for name, labels in definitions if label not in labels
    }


PROMQL_KEYWORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "inf",
    "nan",
}
_STRING = r"\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*'|`[^`]*`"
_GROUPING = r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)"


def promql_metrics(expr: str) -> set[str]:
    """The metric names an expression selects (functions, keywords, labels, durations and
    Grafana variables left out)."""
    text = re.sub(_STRING, '""', expr)
    text = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", text)  # matchers, ranges
    text = re.sub(_GROUPING, " ", text)
    text = re.sub(r"\$\{?\w+\}?", " ", text)  # $__rate_interval, ${var}
    text = re.sub(r"(?<![\w:])\d+(?:\.\d+)?(?:[eE][+-]?\d+)?(?:ms|[smhdwy])?", " ", text)
    names = set()
    for match in re.finditer(r"[A-Za-z_:][\w:]*", text):
        if match.group() in PROMQL_KEYWORDS or text[match.end() :].lstrip().startswith("("):
            continue  # a keyword, or a function or an aggregation
        names.add(match.group())
    return names


def promql_grouping(expr: str) -> set[str]:
    """Label names in by(...), without(...), on(...) and the like."""
    text = re.sub(_STRING, '""', expr)
    return {
        label.strip()
        for labels in re.findall(_GROUPING, text)
        for label in labels.split(",")
        if label.strip()
    }


# The matchers of a selector, in braces (a quoted value may hold a brace: ${model}).
_MATCHERS = rf'\{{((?:{_STRING}|[^}}"\'`])*)\}}'


def promql_matchers(expr: str) -> list[tuple[str, str, str]]:
    """(label, operator, value) of each matcher (``=``, ``!=``, ``=~``, ``!~``)."""
    return [
        found
        for matchers in re.findall(_MATCHERS, expr)
        for found in re.findall(r'(\w+)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"', matchers)
    ]


def promql_selectors(expr: str, metric: str) -> list[str]:
    """The matchers of each selector of ``metric`` in ``expr`` (``""`` where it has none)."""
    name = re.escape(metric)
    found = re.finditer(rf"(?<![\w:]){name}(?![\w:])\s*(?:{_MATCHERS})?", expr)
    return [match.group(1) or "" for match in found]


def selects_by(matchers: str, label: str, variable: str) -> bool:
    """Whether ``matchers`` hold ``label=~"$variable"`` (or ``${variable}``)."""
    value = rf"\$(?:{variable}\b|\{{{variable}\}})"
    return re.search(rf'(?<![\w]){label}\s*=~\s*"{value}"', matchers) is not None


def grafana_query(expr: str, values: Mapping[str, str]) -> str:
    """``expr`` as Grafana sends it: each variable of ``values`` (``$name`` or ``${name}``,
    ``__rate_interval`` among them) replaced by its value, any other left as it is."""
    return re.sub(
        r"\$\{(\w+)\}|\$(\w+)",
        lambda match: values.get(match.group(1) or match.group(2), match.group()),
        expr,
    )


def variables(dashboard: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The dashboard's template variables by name."""
    return {variable["name"]: variable for variable in dashboard["templating"]["list"]}


def all_values(dashboard: dict[str, Any]) -> dict[str, str]:
    """What each variable stands for with All chosen (``$model`` as ``.*``)."""
    return {name: str(v["allValue"]) for name, v in variables(dashboard).items()}


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, those inside collapsed rows too."""
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])


def exprs(panel: dict[str, Any]) -> list[str]:
    return [str(target["expr"]) for target in panel.get("targets", []) if target.get("expr")]


def scrape_targets(prometheus: dict[str, Any]) -> Iterator[tuple[str, str, str, int]]:
    """(job, metrics path, host, port) of every target, static or found by DNS."""
    for job in prometheus["scrape_configs"]:
        path = job.get("metrics_path", "/metrics")
        for static in job.get("static_configs", []):
            for target in static["targets"]:
                host, _, port = str(target).rpartition(":")
                yield job["job_name"], path, host, int(port)
        for dns in job.get("dns_sd_configs", []):
            assert dns.get("type", "SRV") == "A", "SRV records name no port"
            for name in dns["names"]:
                yield job["job_name"], path, name, int(dns["port"])


def target_labels(prometheus: dict[str, Any]) -> set[str]:
    """Labels every scraped series carries: job, instance and those the relabelling adds."""
    added = {
        rule["target_label"]
        for job in prometheus["scrape_configs"]
        for rule in job.get("relabel_configs", [])
        if "target_label" in rule
    }
    return {"job", "instance"} | added
