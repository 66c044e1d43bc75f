"""The metrics the code defines, and the ones a PromQL expression, a scrape config and a
dashboard read."""

from __future__ import annotations

import functools
import importlib
import re
from collections.abc import Iterator
from typing import Any

from prometheus_client.metrics import MetricWrapperBase

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
def exported_series() -> dict[str, frozenset[str]]:
    """Every series name the Sluicegate processes can export, with its label names: the
    metrics defined at module level by every module of ours that uses prometheus_client."""
    found: dict[str, frozenset[str]] = {}
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
                labels = frozenset(metric._labelnames)
                for suffix in SUFFIXES[kind]:
                    found[name + suffix] = labels | ({"le"} if suffix == "_bucket" else set())
    return found


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


def promql_matchers(expr: str) -> list[tuple[str, str]]:
    """(label, value) of each ``label="value"`` matcher."""
    return re.findall(r"(\w+)\s*=\s*\"([^\"]*)\"", " ".join(re.findall(r"\{[^}]*\}", expr)))


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
