"""Reading docker-compose.yml, deploy/ and the Dockerfile the way Compose, Prometheus, Grafana,
nginx and Docker do, and what a service's command and environment make of the code."""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import yaml

from plumbing.settings import Settings
from sluicegate.cli import _parser as cli_parser

ROOT = Path(__file__).resolve().parents[3]
COMPOSE_FILE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
DEPLOY = ROOT / "deploy"
PROMETHEUS_FILE = DEPLOY / "prometheus" / "prometheus.yml"
ALERTS_FILE = DEPLOY / "prometheus" / "alerts.yml"
NGINX_FILE = DEPLOY / "nginx" / "nginx.conf"
GRAFANA = DEPLOY / "grafana"
DATASOURCES_FILE = GRAFANA / "provisioning" / "datasources" / "prometheus.yml"
PROVIDERS_FILE = GRAFANA / "provisioning" / "dashboards" / "sluicegate.yml"
DASHBOARD_FILE = GRAFANA / "dashboards" / "sluicegate.json"

Compose = dict[str, Any]
# The compose file with the files it mounts: compose, prometheus, alerts, datasources,
# providers, dashboard (parsed) and nginx (text).
Deploy = dict[str, Any]
# Sluicegate services that run until stopped (all but the one-shot migration).
ONE_SHOT = "migrate"
ENV_PREFIX = "SLUICEGATE_"


# ---------------------------------------------------------------------------------------------
# Reading the files the way Compose, Prometheus and Grafana do


@functools.cache
def _parsed(path: Path) -> Any:
    text = path.read_text()
    if path.suffix == ".json":
        return json.loads(text)
    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def parsed(path: Path) -> Any:
    """A fresh copy of a parsed file, each check may break its own. Nothing in it is shared
    (YAML merge keys share a mapping between services), so a breakage breaks one place."""
    return json.loads(json.dumps(_parsed(path)))


def load_compose() -> Compose:
    loaded: Compose = parsed(COMPOSE_FILE)
    return loaded


def load_deploy() -> Deploy:
    return {
        "compose": load_compose(),
        "prometheus": parsed(PROMETHEUS_FILE),
        "alerts": parsed(ALERTS_FILE),
        "datasources": parsed(DATASOURCES_FILE),
        "providers": parsed(PROVIDERS_FILE),
        "dashboard": parsed(DASHBOARD_FILE),
        "nginx": NGINX_FILE.read_text(),
    }


def resolve(value: object) -> str:
    """Compose interpolation with an empty environment: ``${X:-d}`` and ``${X-d}`` give d."""
    return re.sub(
        r"\$\{(\w+)(?::?-([^}]*))?\}",
        lambda m: m.group(2) or "",
        "" if value is None else str(value),
    )


def env(service: dict[str, Any]) -> dict[str, str]:
    """A service's environment as strings, from the mapping or the ``KEY=value`` list form."""
    raw = service.get("environment") or {}
    if isinstance(raw, list):
        raw = dict(item.split("=", 1) if "=" in item else (item, "") for item in raw)
    return {key: "" if value is None else str(value) for key, value in raw.items()}


def depends(service: dict[str, Any]) -> dict[str, str]:
    """depends_on as target -> condition (the short list form means service_started)."""
    raw = service.get("depends_on") or {}
    if isinstance(raw, list):
        return dict.fromkeys(raw, "service_started")
    return {name: (spec or {}).get("condition", "service_started") for name, spec in raw.items()}


def mounts(service: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(source, target) of each volume entry, short or long syntax."""
    for volume in service.get("volumes", []):
        if isinstance(volume, dict):
            yield str(volume.get("source", "")), str(volume["target"])
        else:
            source, _, rest = str(volume).partition(":")
            yield source, rest.split(":")[0]


def is_named_volume(source: str) -> bool:
    return bool(source) and not source.startswith((".", "/", "~", "$"))


def named_mount_targets(service: dict[str, Any]) -> set[str]:
    return {target for source, target in mounts(service) if is_named_volume(source)}


def bind_mounts(service: dict[str, Any]) -> dict[str, Path]:
    """Container path -> the repository file or folder bind-mounted there."""
    return {
        target: (ROOT / source).resolve()
        for source, target in mounts(service)
        if source.startswith("./")
    }


def listeners(value: str) -> dict[str, tuple[str, int]]:
    """``NAME://host:port,...`` -> {NAME: (host, port)}."""
    parsed = {}
    for item in filter(None, value.split(",")):
        name, _, address = item.partition("://")
        host, _, port = address.rpartition(":")
        parsed[name] = (host, int(port))
    return parsed


def seconds(duration: object) -> float:
    """A Compose (or nginx) duration (``60s``, ``1m30s``) in seconds."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|ns|h|m|s)", str(duration))
    assert parts, f"not a duration: {duration!r}"
    return sum(float(number) * units[unit] for number, unit in parts)


def sluicegate_services(compose: Compose) -> dict[str, dict[str, Any]]:
    """The services built from this repository (every Sluicegate role)."""
    return {name: svc for name, svc in compose["services"].items() if "build" in svc}


def long_running(compose: Compose) -> dict[str, dict[str, Any]]:
    """The Sluicegate services that run until stopped."""
    return {name: svc for name, svc in sluicegate_services(compose).items() if name != ONE_SHOT}


@functools.cache
def _cli() -> argparse.ArgumentParser:
    return cli_parser()


def cli_args(service: dict[str, Any]) -> argparse.Namespace:
    """The service's command as the ``sluicegate`` entry point parses it."""
    command = [str(arg) for arg in service["command"]]
    try:
        return _cli().parse_args(command)
    except SystemExit as exc:  # argparse's answer to an unknown role or option
        raise AssertionError(f"`sluicegate {' '.join(command)}` is refused") from exc


def settings_of(service: dict[str, Any]) -> Settings:
    """The settings a service's process builds from its environment (and nothing else of the
    environment this test runs in)."""
    values = {key: resolve(value) for key, value in env(service).items()}
    unknown = {
        key
        for key in values
        if key.startswith(ENV_PREFIX)
        and key.removeprefix(ENV_PREFIX).lower() not in Settings.model_fields
    }
    # Settings ignores unknown variables, so a misspelt one would silently do nothing.
    assert not unknown, f"no such settings: {sorted(unknown)}"
    return _settings(tuple(sorted(values.items())))


@functools.cache
def _settings(environment: tuple[tuple[str, str], ...]) -> Settings:
    with mock.patch.dict(os.environ):
        for key in [key for key in os.environ if key.startswith(ENV_PREFIX)]:
            del os.environ[key]
        os.environ.update(environment)
        return Settings()


def metrics_port(service: dict[str, Any]) -> int:
    """Where a Sluicegate process serves /metrics: the API on its HTTP port, the others on
    ``metrics_port``."""
    args = cli_args(service)
    settings = settings_of(service)
    if args.command == "api":
        return int(args.port or settings.api_port)
    assert settings.metrics_port is not None, f"`{args.command}` serves no metrics"
    return settings.metrics_port


def replicas(service: dict[str, Any]) -> int:
    return int(resolve(service.get("deploy", {}).get("replicas", 1)))


def gpu_devices(service: dict[str, Any]) -> list[dict[str, Any]]:
    devices = service.get("deploy", {}).get("resources", {}).get("reservations", {})
    return [
        d
        for d in devices.get("devices", [])
        if d.get("driver") == "nvidia" and "gpu" in d.get("capabilities", [])
    ]


# ---------------------------------------------------------------------------------------------
# nginx.conf and the Dockerfile


def nginx_uncommented(text: str) -> str:
    return re.sub(r"#[^\n]*", "", text)


def nginx_directives(text: str) -> list[tuple[str, list[str]]]:
    """(name, arguments) of every simple directive, comments dropped."""
    text = nginx_uncommented(text)
    return [
        (words[0], words[1:])
        for statement in re.findall(r"([^;{}]+);", text)
        if (words := statement.split())
    ]


def nginx_size(value: str) -> int:
    match = re.fullmatch(r"(\d+)([kKmMgG]?)", value)
    assert match, f"not a size: {value!r}"
    units = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    return int(match.group(1)) * units[match.group(2).lower()]


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    found = []
    for line in joined.splitlines():
        if line.strip():
            keyword, _, rest = line.strip().partition(" ")
            found.append((keyword.upper(), rest.strip()))
    return found
