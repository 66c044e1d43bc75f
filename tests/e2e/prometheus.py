"""A Prometheus of a test's own (Debian's ``prometheus``, started as a process) that scrapes
the roles the test started with the scrape jobs of deploy/prometheus/prometheus.yml.

``scrape_config`` derives the test's configuration from the deploy file: every scrape job
keeps its name, path and relabelling; only how its targets are found changes (the test's
``host:port`` instead of Docker's DNS), and each target group carries the label the DNS
discovery would have set (``__meta_dns_name``), so the same relabelling gives the same
``service`` label. tests/unit/deploy/test_e2e_prometheus.py checks the derivation.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY_CONFIG = ROOT / "deploy" / "prometheus" / "prometheus.yml"
# The label Prometheus' DNS discovery gives each target: the name it looked up.
DNS_NAME = "__meta_dns_name"


def load_deploy_config(path: Path = DEPLOY_CONFIG) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(path.read_text())
    return loaded


def scrape_config(
    deploy: Mapping[str, Any], targets: Mapping[str, Sequence[str]], interval: str = "1s"
) -> dict[str, Any]:
    """The deploy configuration with each job's targets replaced by ``targets[job_name]``
    (``host:port`` each), scraped and evaluated every ``interval``.

    Each job's DNS discovery becomes one static group, labelled with the first name the job
    looked up (``worker`` for the workers' job), as the discovery would have labelled a
    target it found under that name. Nothing else of a job changes.
    """
    # A copy that shares nothing: YAML anchors (the relabelling) make jobs share a list.
    config: dict[str, Any] = json.loads(json.dumps(deploy))
    jobs = [job["job_name"] for job in config["scrape_configs"]]
    if sorted(jobs) != sorted(targets):
        raise ValueError(f"targets for {sorted(targets)}, but the scrape jobs are {jobs}")
    # Rule files are read relative to the configuration's file: the test's is elsewhere.
    config["rule_files"] = [str(DEPLOY_CONFIG.parent / f) for f in config.get("rule_files", [])]
    config["global"] = {
        **config.get("global", {}),
        "scrape_interval": interval,
        "scrape_timeout": interval,
        "evaluation_interval": interval,
    }
    for job in config["scrape_configs"]:
        discovered = job.pop("dns_sd_configs", [])
        job.pop("static_configs", None)
        group: dict[str, Any] = {"targets": list(targets[job["job_name"]])}
        names = [name for dns in discovered for name in dns.get("names", [])]
        if names:
            group["labels"] = {DNS_NAME: names[0]}
        job["static_configs"] = [group]
    return config


@dataclass
class Prometheus:
    process: subprocess.Popen[bytes]
    url: str
    log: Path

    async def query(self, client: httpx.AsyncClient, expr: str) -> dict[str, Any]:
        """``/api/v1/query`` of ``expr`` now: its ``data`` (resultType and result)."""
        r = await client.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10)
        body: dict[str, Any] = r.json()
        if r.status_code != 200 or body.get("status") != "success":
            raise AssertionError(f"query {expr!r}: {r.status_code} {r.text}")
        data: dict[str, Any] = body["data"]
        return data

    async def targets(self, client: httpx.AsyncClient) -> list[dict[str, Any]]:
        r = await client.get(f"{self.url}/api/v1/targets", timeout=10)
        r.raise_for_status()
        active: list[dict[str, Any]] = r.json()["data"]["activeTargets"]
        return active

    async def rules(self, client: httpx.AsyncClient) -> list[dict[str, Any]]:
        """Every rule Prometheus loaded, with its ``health`` and ``lastError``."""
        r = await client.get(f"{self.url}/api/v1/rules", timeout=10)
        r.raise_for_status()
        groups = r.json()["data"]["groups"]
        return [rule for group in groups for rule in group["rules"]]

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def binary() -> str | None:
    return shutil.which("prometheus")


@contextlib.contextmanager
def running(config: Mapping[str, Any], directory: Path, port: int) -> Iterator[Prometheus]:
    """Prometheus on 127.0.0.1:``port`` with ``config``, its data and log in
    ``directory``; stopped with SIGTERM (SIGKILL if it does not exit) on the way out."""
    found = binary()
    assert found is not None, "no prometheus binary"
    directory.mkdir(parents=True, exist_ok=True)
    config_file = directory / "prometheus.yml"
    config_file.write_text(yaml.safe_dump(dict(config), sort_keys=False))
    log = directory / "prometheus.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [
                found,
                f"--config.file={config_file}",
                f"--storage.tsdb.path={directory / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        yield Prometheus(process, f"http://127.0.0.1:{port}", log)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


async def ready(prometheus: Prometheus, client: httpx.AsyncClient, within_s: float) -> None:
    """Until Prometheus answers ``/-/ready``; it must not exit meanwhile."""
    deadline = time.monotonic() + within_s
    while True:
        assert prometheus.process.poll() is None, prometheus.output()[-3000:]
        with contextlib.suppress(httpx.TransportError):
            if (await client.get(f"{prometheus.url}/-/ready", timeout=2)).status_code == 200:
                return
        assert time.monotonic() < deadline, "prometheus not ready:\n" + prometheus.output()[-3000:]
        await asyncio.sleep(0.1)
