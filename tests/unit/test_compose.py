"""docker-compose.yml parses and wires the services the way the stack relies on."""

from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SLUICEGATE = ("migrate", "api", "relay", "worker", "sim-worker")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return loaded


def test_services_exist(compose: dict[str, Any]) -> None:
    assert {"kafka", "postgres", *SLUICEGATE} <= set(compose["services"])


def test_kafka_runs_kraft_without_zookeeper(compose: dict[str, Any]) -> None:
    kafka = compose["services"]["kafka"]
    assert kafka["image"].startswith("apache/kafka:")
    env = kafka["environment"]
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"]
    assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"
    assert "zookeeper" not in (ROOT / "docker-compose.yml").read_text().lower()


def test_sluicegate_services_point_at_compose_services(compose: dict[str, Any]) -> None:
    for name in SLUICEGATE:
        env = compose["services"][name]["environment"]
        assert "@postgres:5432/" in env["SLUICEGATE_DATABASE_URL"], name
        assert env["SLUICEGATE_KAFKA_BOOTSTRAP_SERVERS"] == "kafka:9092", name


def test_roles_wait_for_migrations(compose: dict[str, Any]) -> None:
    for name in ("api", "relay", "worker", "sim-worker"):
        depends = compose["services"][name]["depends_on"]
        assert depends["migrate"]["condition"] == "service_completed_successfully", name
    assert compose["services"]["migrate"]["command"] == ["migrate"]


def test_worker_reserves_a_gpu_and_runs_vllm(compose: dict[str, Any]) -> None:
    worker = compose["services"]["worker"]
    devices = worker["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia"
    assert "gpu" in devices[0]["capabilities"]
    assert worker["environment"]["SLUICEGATE_ENGINE"].startswith("vllm")
    assert worker["build"]["args"]["EXTRAS"] == "vllm"


def test_state_is_on_volumes_and_checked(compose: dict[str, Any]) -> None:
    declared = set(compose["volumes"])
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            assert source in declared, f"{name} uses undeclared volume {source}"
        for target in service.get("depends_on", {}):
            assert target in compose["services"], f"{name} depends on unknown {target}"
    for name in ("kafka", "postgres"):
        assert compose["services"][name]["volumes"]
        assert compose["services"][name]["healthcheck"]["test"]


def test_dockerfile_entrypoint() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["sluicegate"]' in text
