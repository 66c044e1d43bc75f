"""Every check of docker-compose.yml, the Dockerfile and .dockerignore rejects a copy of the
files broken in the way it guards against, so that none can pass vacuously
(test_broken_deploy does the same for deploy/)."""

from __future__ import annotations

import copy

import pytest

from tests.unit.deploy.breaking import (
    BROKEN,
    Breakage,
    at,
    edit,
    gpu_twin,
)
from tests.unit.deploy.compose_checks import (
    COMPOSE_CHECKS,
    check_api,
    check_cli_roles,
    check_dockerfile,
    check_dockerignore,
    check_gpu_workers,
    check_kafka_is_the_tested_one,
    check_kafka_kraft,
    check_lifecycle,
    check_metrics_endpoints,
    check_partitions,
    check_pinned_images,
    check_pools,
    check_references,
    check_roles_wait_for_migrations,
    check_services,
    check_settings,
    check_sluicegate_env,
    check_state_and_health,
    check_stop_grace,
    check_volumes,
    check_workers,
)
from tests.unit.deploy.files import (
    DOCKERFILE,
    DOCKERIGNORE,
    load_compose,
    sluicegate_services,
)

S = "services"
KAFKA_ENV = f"{S}/kafka/environment"
WORKER_ENV = f"{S}/worker/environment"
WEBHOOKS = f"{S}/webhooks"
API_CMD = ["api", "--host", "0.0.0.0", "--port", "8000", "--workers", "4"]
DEVICE_0 = f"{S}/worker/deploy/resources/reservations/devices/0"
DB_URL = "postgresql://sluicegate:sluicegate@{}:5432/{}"
BREAKAGES = [
    Breakage("no relay", check_services, at(f"{S}/relay")),
    Breakage("no webhooks", check_services, at(WEBHOOKS)),
    Breakage("api not built", check_services, at(f"{S}/api/build")),
    Breakage("role misspelt", check_cli_roles, at(f"{WEBHOOKS}/command", ["hooks"])),
    Breakage(
        "option the role lacks",
        check_cli_roles,
        at(f"{S}/relay/command", ["relay", "--workers", "2"]),
    ),
    Breakage("webhooks never run", check_cli_roles, at(WEBHOOKS)),
    Breakage("a client as a service", check_cli_roles, at(f"{S}/relay/command", ["up"])),
    Breakage(
        "misspelt setting",
        check_settings,
        at(f"{S}/relay/environment/SLUICEGATE_METRIC_PORT", "9100"),
    ),
    Breakage("engine Settings refuses", check_settings, at(f"{WORKER_ENV}/SLUICEGATE_ENGINE", "x")),
    Breakage("bitnami kafka", check_kafka_kraft, at(f"{S}/kafka/image", "bitnami/kafka:3.9")),
    Breakage("unpinned kafka", check_kafka_kraft, at(f"{S}/kafka/image", "apache/kafka:latest")),
    Breakage(
        "kafka the tests do not run",
        check_kafka_is_the_tested_one,
        at(f"{S}/kafka/image", "apache/kafka:3.9.1"),
    ),
    Breakage(
        "rebalance delay the tests do not have",
        check_kafka_is_the_tested_one,
        at(f"{KAFKA_ENV}/KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS", 3000),
    ),
    Breakage("broker only", check_kafka_kraft, at(f"{KAFKA_ENV}/KAFKA_PROCESS_ROLES", "broker")),
    Breakage("no voters", check_kafka_kraft, at(f"{KAFKA_ENV}/KAFKA_CONTROLLER_QUORUM_VOTERS")),
    Breakage(
        "voter is another node",
        check_kafka_kraft,
        at(f"{KAFKA_ENV}/KAFKA_CONTROLLER_QUORUM_VOTERS", "2@kafka:9093"),
    ),
    Breakage(
        "no controller listener",
        check_kafka_kraft,
        at(f"{KAFKA_ENV}/KAFKA_LISTENERS", "PLAINTEXT://:9092"),
    ),
    Breakage(
        "advertises localhost",
        check_kafka_kraft,
        at(f"{KAFKA_ENV}/KAFKA_ADVERTISED_LISTENERS", "PLAINTEXT://localhost:9092"),
    ),
    Breakage("zookeeper", check_kafka_kraft, at(f"{KAFKA_ENV}/KAFKA_ZOOKEEPER_CONNECT", "zk:2181")),
    Breakage(
        "auto-create topics",
        check_kafka_kraft,
        at(f"{KAFKA_ENV}/KAFKA_AUTO_CREATE_TOPICS_ENABLE", "true"),
    ),
    Breakage(
        "offsets replicated 3",
        check_kafka_kraft,
        at(f"{KAFKA_ENV}/KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR", 3),
    ),
    Breakage(
        "log dirs off the volume",
        check_kafka_kraft,
        at(f"{KAFKA_ENV}/KAFKA_LOG_DIRS", "/tmp/kraft-combined-logs"),
    ),
    Breakage(
        "database on localhost",
        check_sluicegate_env,
        at(f"{S}/relay/environment/SLUICEGATE_DATABASE_URL", DB_URL.format("localhost", "x")),
    ),
    Breakage(
        "wrong database name",
        check_sluicegate_env,
        at(f"{S}/migrate/environment/SLUICEGATE_DATABASE_URL", DB_URL.format("postgres", "x")),
    ),
    Breakage("no database url", check_sluicegate_env, at(f"{WORKER_ENV}/SLUICEGATE_DATABASE_URL")),
    Breakage(
        "kafka on localhost",
        check_sluicegate_env,
        at(f"{WORKER_ENV}/SLUICEGATE_KAFKA_BOOTSTRAP_SERVERS", "localhost:9092"),
    ),
    Breakage("partitions disagree", check_partitions, at(f"{KAFKA_ENV}/KAFKA_NUM_PARTITIONS", 3)),
    Breakage(
        "api starts before migrations end",
        check_roles_wait_for_migrations,
        at(f"{S}/api/depends_on/migrate/condition", "service_started"),
    ),
    Breakage(
        "relay depends_on short form",
        check_roles_wait_for_migrations,
        at(f"{S}/relay/depends_on", ["migrate", "kafka"]),
    ),
    Breakage("worker does not wait", check_roles_wait_for_migrations, at(f"{S}/worker/depends_on")),
    Breakage(
        "webhooks do not wait",
        check_roles_wait_for_migrations,
        at(f"{WEBHOOKS}/depends_on/migrate"),
    ),
    Breakage(
        "unquoted restart no",
        check_roles_wait_for_migrations,
        at(f"{S}/migrate/restart", False),
    ),
    Breakage("api on 8080", check_api, at(f"{S}/api/ports", ["8080:8080"])),
    Breakage("api without healthcheck", check_api, at(f"{S}/api/healthcheck")),
    Breakage("four uvicorn processes in one api", check_api, at(f"{S}/api/command", API_CMD)),
    Breakage("one api replica", check_api, at(f"{S}/api/deploy")),
    Breakage(
        "metrics on a port not exposed",
        check_metrics_endpoints,
        at(f"{S}/relay/environment/SLUICEGATE_METRICS_PORT", "9200"),
    ),
    Breakage(
        "webhooks serve no metrics",
        check_metrics_endpoints,
        at(f"{WEBHOOKS}/environment/SLUICEGATE_METRICS_PORT"),
    ),
    Breakage("no gpu", check_workers, at(f"{S}/worker/deploy")),
    Breakage("amd gpu", check_workers, at(f"{DEVICE_0}/driver", "amd")),
    Breakage(
        "worker on the simulator", check_workers, at(f"{WORKER_ENV}/SLUICEGATE_ENGINE", "sim")
    ),
    Breakage("no vllm extra", check_workers, at(f"{S}/worker/build/args")),
    Breakage(
        "past the knee",
        check_workers,
        at(f"{WORKER_ENV}/SLUICEGATE_VLLM_GPU_MEMORY_UTILIZATION", "0.98"),
    ),
    Breakage("model cache in the container", check_workers, at(f"{S}/worker/volumes")),
    Breakage("short grace", check_workers, at(f"{S}/worker/stop_grace_period", "10s")),
    Breakage("sim worker always on", check_workers, at(f"{S}/sim-worker/profiles")),
    Breakage("two workers on GPU 0", check_gpu_workers, gpu_twin(device_ids=["0"])),
    Breakage("a second worker by count", check_gpu_workers, gpu_twin(count=1)),
    Breakage("gpu worker replicated", check_gpu_workers, at(f"{S}/worker/deploy/replicas", 2)),
    Breakage("gpu by count beside ids", check_gpu_workers, at(f"{DEVICE_0}/count", 1)),
    Breakage("small model without a gpu worker", check_pools, at(f"{S}/worker-small")),
    Breakage("small model without a cpu worker", check_pools, at(f"{S}/sim-worker-small")),
    Breakage(
        "both gpu workers on one pool",
        check_pools,
        at(f"{S}/worker-small/environment/SLUICEGATE_WORKER_MODEL"),
    ),
    Breakage(
        "a worker of no pool",
        check_pools,
        at(f"{S}/sim-worker-small/environment/SLUICEGATE_WORKER_MODEL", "gamma"),
    ),
    Breakage(
        "the relay knows one pool",
        check_pools,
        at(f"{S}/relay/environment/SLUICEGATE_POOLS", '{"alpha": {}}'),
    ),
    Breakage(
        "one pool",
        check_pools,
        lambda compose: [
            service["environment"].pop("SLUICEGATE_POOLS")
            for service in sluicegate_services(compose).values()
        ],
    ),
    Breakage(
        "webhooks killed mid-attempt",
        check_stop_grace,
        at(f"{WEBHOOKS}/stop_grace_period", "10s"),
    ),
    Breakage(
        "sim worker drains past its grace",
        check_stop_grace,
        at(f"{S}/sim-worker/environment/SLUICEGATE_DRAIN_TIMEOUT_S", "40"),
    ),
    Breakage("postgres without volume", check_state_and_health, at(f"{S}/postgres/volumes")),
    Breakage("kafka without healthcheck", check_state_and_health, at(f"{S}/kafka/healthcheck")),
    Breakage("webhooks without healthcheck", check_state_and_health, at(f"{WEBHOOKS}/healthcheck")),
    Breakage(
        "prometheus data in the container",
        check_volumes,
        at(f"{S}/prometheus/volumes", ["./deploy/prometheus:/etc/prometheus"]),
    ),
    Breakage(
        "grafana data in the container",
        check_volumes,
        edit(f"{S}/grafana/volumes", lambda volumes: volumes[:-1]),
    ),
    Breakage(
        "depends on a missing service",
        check_references,
        at(f"{S}/api/depends_on/kafka-broker", {"condition": "service_started"}),
    ),
    Breakage("healthy without a healthcheck", check_references, at(f"{S}/kafka/healthcheck")),
    Breakage("undeclared volume", check_references, at(f"{S}/worker/volumes", ["hf:/models"])),
    Breakage(
        "mounts a missing file",
        check_references,
        at(f"{S}/gateway/volumes", ["./deploy/nginx/gone.conf:/etc/nginx/nginx.conf:ro"]),
    ),
    Breakage("relay never restarts", check_lifecycle, at(f"{S}/relay/restart")),
    Breakage(
        "worker stopped by SIGKILL", check_lifecycle, at(f"{S}/worker/stop_signal", "SIGKILL")
    ),
    Breakage("gateway cut by SIGTERM", check_lifecycle, at(f"{S}/gateway/stop_signal", "SIGTERM")),
    Breakage(
        "grafana unpinned",
        check_pinned_images,
        at(f"{S}/grafana/image", "grafana/grafana:latest"),
    ),
    Breakage("prometheus untagged", check_pinned_images, at(f"{S}/prometheus/image", "prom/prom")),
]


@pytest.mark.parametrize("breakage", BREAKAGES, ids=lambda b: b.id)
def test_broken_files_are_rejected(breakage: Breakage) -> None:
    files = load_compose()
    breakage.check(copy.deepcopy(files))  # passes on the real files...
    breakage.mutate(files)
    with pytest.raises(BROKEN):  # ...and fails on the broken ones
        breakage.check(files)


def test_every_check_has_a_breakage() -> None:
    assert {b.check for b in BREAKAGES} == set(COMPOSE_CHECKS)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ('ENTRYPOINT ["sluicegate"]', 'ENTRYPOINT ["python", "-m", "sluicegate"]'),
        ("USER sluicegate", "USER root"),
        ("FROM python:3.11-slim", "FROM python:3.12-slim"),
        ('ARG EXTRAS=""', "ARG FEATURES="),
    ],
)
def test_broken_dockerfile_is_rejected(old: str, new: str) -> None:
    text = DOCKERFILE.read_text()
    assert old in text
    with pytest.raises(BROKEN):
        check_dockerfile(text.replace(old, new))


def test_broken_dockerignore_is_rejected() -> None:
    text = DOCKERIGNORE.read_text()
    broken = "\n".join(line for line in text.splitlines() if line.strip() != ".venv")
    with pytest.raises(BROKEN):
        check_dockerignore(broken)
