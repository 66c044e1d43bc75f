"""docker-compose.yml and the Dockerfile wire the stack the way Sluicegate relies on.

Every rule is a check over the parsed file. The real files must pass every check, and every
check must reject a copy of the file broken in the way that check guards against, so that none
of them can pass vacuously.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import urlsplit

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"

Compose = dict[str, Any]
CORE = ("kafka", "postgres", "migrate", "api", "relay", "worker")
SLUICEGATE_CORE = ("migrate", "api", "relay", "worker")
# What a broken file makes a check raise: a failed assertion or a missing/ill-typed key.
BROKEN = (AssertionError, LookupError, TypeError, ValueError)


# ---------------------------------------------------------------------------------------------
# Reading the file the way Compose does


def load_compose() -> Compose:
    loaded: Compose = yaml.safe_load(COMPOSE_FILE.read_text())
    return loaded


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


def listeners(value: str) -> dict[str, tuple[str, int]]:
    """``NAME://host:port,...`` -> {NAME: (host, port)}."""
    parsed = {}
    for item in filter(None, value.split(",")):
        name, _, address = item.partition("://")
        host, _, port = address.rpartition(":")
        parsed[name] = (host, int(port))
    return parsed


def seconds(duration: object) -> float:
    """A Compose duration (``60s``, ``1m30s``) in seconds."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|ns|h|m|s)", str(duration))
    assert parts, f"not a duration: {duration!r}"
    return sum(float(number) * units[unit] for number, unit in parts)


def sluicegate_services(compose: Compose) -> dict[str, dict[str, Any]]:
    """The services built from this repository (every Sluicegate role)."""
    return {name: svc for name, svc in compose["services"].items() if "build" in svc}


# ---------------------------------------------------------------------------------------------
# The checks


def check_services(compose: Compose) -> None:
    services = compose["services"]
    missing = set(CORE) - set(services)
    assert not missing, f"missing services: {sorted(missing)}"
    for name in SLUICEGATE_CORE:
        assert name in sluicegate_services(compose), f"{name} is not built from this repository"
        assert services[name]["command"][0] == name, f"{name} does not run `sluicegate {name}`"


def check_kafka_kraft(compose: Compose) -> None:
    kafka = compose["services"]["kafka"]
    assert re.fullmatch(r"apache/kafka:(3\.9|4\.\d+)\.\d+", kafka["image"]), kafka["image"]
    e = env(kafka)
    assert set(e["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    voters = {}
    for voter in e["KAFKA_CONTROLLER_QUORUM_VOTERS"].split(","):
        node, _, address = voter.partition("@")
        host, _, port = address.rpartition(":")
        voters[node] = (host, int(port))
    assert e["KAFKA_NODE_ID"] in voters, "the node is not a voter of its own quorum"
    own = listeners(e["KAFKA_LISTENERS"])
    controller_names = e["KAFKA_CONTROLLER_LISTENER_NAMES"].split(",")
    for name in controller_names:
        assert name in own, f"no {name} listener"
    assert voters[e["KAFKA_NODE_ID"]] == ("kafka", own[controller_names[0]][1])
    protocols = dict(
        item.split(":") for item in e["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(",")
    )
    assert set(own) <= set(protocols), "a listener has no security protocol"
    advertised = listeners(e["KAFKA_ADVERTISED_LISTENERS"])
    assert ("kafka", 9092) in advertised.values(), "kafka:9092 is not advertised"
    assert not set(advertised) & set(controller_names), "the controller listener is advertised"
    assert e["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"
    assert int(resolve(e["KAFKA_NUM_PARTITIONS"])) >= 1
    assert e["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"] == "1"
    assert e["KAFKA_LOG_DIRS"] in named_mount_targets(kafka), "the log dirs are not on a volume"
    assert "zookeeper" not in yaml.safe_dump(compose).lower()


def check_sluicegate_env(compose: Compose) -> None:
    postgres = env(compose["services"]["postgres"])
    kafka = listeners(env(compose["services"]["kafka"])["KAFKA_ADVERTISED_LISTENERS"]).values()
    for name, service in sluicegate_services(compose).items():
        e = env(service)
        url = urlsplit(resolve(e["SLUICEGATE_DATABASE_URL"]))
        assert url.scheme == "postgresql", name
        assert (url.hostname, url.port or 5432) == ("postgres", 5432), name
        assert url.username == postgres["POSTGRES_USER"], name
        assert url.password == resolve(postgres["POSTGRES_PASSWORD"]), name
        assert url.path == "/" + postgres["POSTGRES_DB"], name
        for server in e["SLUICEGATE_KAFKA_BOOTSTRAP_SERVERS"].split(","):
            host, _, port = server.rpartition(":")
            assert (host, int(port)) in kafka, f"{name}: {server} is not kafka's listener"
        assert e["SLUICEGATE_KAFKA_IDEMPOTENT_PRODUCER"] == "true", name


def check_partitions(compose: Compose) -> None:
    brokers = int(resolve(env(compose["services"]["kafka"])["KAFKA_NUM_PARTITIONS"]))
    for name, service in sluicegate_services(compose).items():
        partitions = int(resolve(env(service)["SLUICEGATE_PARTITIONS"]))
        assert partitions == brokers, f"{name}: {partitions} partitions, broker default {brokers}"


def check_roles_wait_for_migrations(compose: Compose) -> None:
    services = compose["services"]
    migrate = services["migrate"]
    assert migrate["command"] == ["migrate"]
    assert migrate["restart"] == "no", "migrate is one-shot (an unquoted no is a boolean)"
    assert depends(migrate).get("postgres") == "service_healthy"
    for name, service in sluicegate_services(compose).items():
        if name == "migrate":
            continue
        wait = depends(service)
        assert wait.get("migrate") == "service_completed_successfully", name
        assert wait.get("kafka") == "service_healthy", name


def check_api(compose: Compose) -> None:
    api = compose["services"]["api"]
    command = api["command"]
    for flag, value in (("--host", "0.0.0.0"), ("--port", "8000")):
        assert command[command.index(flag) + 1] == value, flag
    assert int(command[command.index("--workers") + 1]) >= 1
    assert any(str(port).endswith(":8000") for port in api["ports"]), api["ports"]
    assert "/healthz" in " ".join(api["healthcheck"]["test"])


def check_workers(compose: Compose) -> None:
    worker = compose["services"]["worker"]
    devices = worker["deploy"]["resources"]["reservations"]["devices"]
    assert any(
        d.get("driver") == "nvidia"
        and "gpu" in d.get("capabilities", [])
        and (d.get("count") in (1, "all") or d.get("device_ids"))
        for d in devices
    ), devices
    e = env(worker)
    assert e["SLUICEGATE_ENGINE"].startswith("vllm_"), e["SLUICEGATE_ENGINE"]
    assert "vllm" in worker["build"]["args"]["EXTRAS"].split(",")
    assert resolve(e["SLUICEGATE_VLLM_MODEL"]), "no model"
    assert 0.5 <= float(e["SLUICEGATE_VLLM_GPU_MEMORY_UTILIZATION"]) <= 0.9
    assert e["HF_HOME"] in named_mount_targets(worker), "the model cache is not on a volume"
    assert worker["shm_size"]
    grace = seconds(worker["stop_grace_period"])
    assert grace >= 30, "no time for the graceful drain"
    assert float(e.get("SLUICEGATE_DRAIN_TIMEOUT_S", "20")) < grace, "drain outlasts the grace"
    sim = compose["services"]["sim-worker"]
    assert "cpu" in sim["profiles"]
    assert env(sim)["SLUICEGATE_ENGINE"] == "sim"
    assert "deploy" not in sim, "the CPU worker must not reserve a GPU"


def check_state_and_health(compose: Compose) -> None:
    for name in ("kafka", "postgres"):
        service = compose["services"][name]
        assert named_mount_targets(service), f"{name} keeps its data in the container"
        test = service["healthcheck"]["test"]
        assert test[0] in ("CMD", "CMD-SHELL"), f"{name} has no healthcheck"
    assert "pg_isready" in " ".join(compose["services"]["postgres"]["healthcheck"]["test"])


def check_references(compose: Compose) -> None:
    services = compose["services"]
    declared = set(compose.get("volumes") or {})
    for name, service in services.items():
        for target, condition in depends(service).items():
            assert target in services, f"{name} depends on unknown {target}"
            if condition == "service_healthy":
                assert "healthcheck" in services[target], f"{target} has no healthcheck"
        for source, _ in mounts(service):
            if is_named_volume(source):
                assert source in declared, f"{name} uses undeclared volume {source}"


def check_lifecycle(compose: Compose) -> None:
    for name, service in compose["services"].items():
        if name == "migrate":
            continue
        assert service.get("restart") == "unless-stopped", name
        # PostgreSQL's fast shutdown is SIGINT (its image's own stop signal); SIGTERM for it
        # would wait for every pooled client connection to close.
        expected = "SIGINT" if name == "postgres" else "SIGTERM"
        assert service.get("stop_signal") == expected, name


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


def check_dockerfile(text: str) -> None:
    instructions = dockerfile_instructions(text)
    args = {keyword: [a for k, a in instructions if k == keyword] for keyword, _ in instructions}
    assert args["FROM"][0].startswith("python:3.11-slim"), args["FROM"]
    assert any(a.split("=")[0] == "EXTRAS" for a in args["ARG"]), "no EXTRAS build arg"
    assert any("pip install" in a and "EXTRAS" in a for a in args["RUN"]), "EXTRAS unused"
    assert args["USER"][-1] not in ("root", "0"), "runs as root"
    assert json.loads(args["ENTRYPOINT"][-1]) == ["sluicegate"]


def check_dockerignore(text: str) -> None:
    patterns = {line.strip().rstrip("/") for line in text.splitlines()}
    for needed in (".venv", ".git"):
        assert needed in patterns, f"{needed} is sent to the build"


COMPOSE_CHECKS: list[Callable[[Compose], None]] = [
    check_services,
    check_kafka_kraft,
    check_sluicegate_env,
    check_partitions,
    check_roles_wait_for_migrations,
    check_api,
    check_workers,
    check_state_and_health,
    check_references,
    check_lifecycle,
]


# ---------------------------------------------------------------------------------------------
# The real files pass


@pytest.mark.parametrize("check", COMPOSE_CHECKS, ids=lambda check: check.__name__)
def test_compose_file(check: Callable[[Compose], None]) -> None:
    check(load_compose())


def test_no_zookeeper_anywhere() -> None:
    assert "zookeeper" not in COMPOSE_FILE.read_text().lower()


def test_dockerfile() -> None:
    check_dockerfile(DOCKERFILE.read_text())


def test_dockerignore() -> None:
    check_dockerignore(DOCKERIGNORE.read_text())


# ---------------------------------------------------------------------------------------------
# ... and broken copies fail


def _parent(compose: Compose, path: str) -> tuple[Any, Any]:
    """The container holding the last key of a /-separated path (list indices as numbers)."""
    node: Any = compose
    keys: list[Any] = [int(k) if k.isdigit() else k for k in path.split("/")]
    for key in keys[:-1]:
        node = node[key]
    return node, keys[-1]


def put(compose: Compose, path: str, value: object) -> None:
    """Set a value by a /-separated path (services/kafka/image)."""
    node, last = _parent(compose, path)
    node[last] = value


def drop(compose: Compose, path: str) -> None:
    node, last = _parent(compose, path)
    del node[last]


class Breakage(NamedTuple):
    id: str
    check: Callable[[Compose], None]
    mutate: Callable[[Compose], None]


KAFKA_ENV = "services/kafka/environment"
BREAKAGES = [
    Breakage("no relay", check_services, lambda c: drop(c, "services/relay")),
    Breakage("api not built", check_services, lambda c: drop(c, "services/api/build")),
    Breakage(
        "bitnami kafka",
        check_kafka_kraft,
        lambda c: put(c, "services/kafka/image", "bitnami/kafka:3.9"),
    ),
    Breakage(
        "unpinned kafka",
        check_kafka_kraft,
        lambda c: put(c, "services/kafka/image", "apache/kafka:latest"),
    ),
    Breakage(
        "broker only",
        check_kafka_kraft,
        lambda c: put(c, f"{KAFKA_ENV}/KAFKA_PROCESS_ROLES", "broker"),
    ),
    Breakage(
        "no voters",
        check_kafka_kraft,
        lambda c: drop(c, f"{KAFKA_ENV}/KAFKA_CONTROLLER_QUORUM_VOTERS"),
    ),
    Breakage(
        "voter is another node",
        check_kafka_kraft,
        lambda c: put(c, f"{KAFKA_ENV}/KAFKA_CONTROLLER_QUORUM_VOTERS", "2@kafka:9093"),
    ),
    Breakage(
        "no controller listener",
        check_kafka_kraft,
        lambda c: put(c, f"{KAFKA_ENV}/KAFKA_LISTENERS", "PLAINTEXT://:9092"),
    ),
    Breakage(
        "advertises localhost",
        check_kafka_kraft,
        lambda c: put(c, f"{KAFKA_ENV}/KAFKA_ADVERTISED_LISTENERS", "PLAINTEXT://localhost:9092"),
    ),
    Breakage(
        "zookeeper",
        check_kafka_kraft,
        lambda c: put(c, f"{KAFKA_ENV}/KAFKA_ZOOKEEPER_CONNECT", "zk:2181"),
    ),
    Breakage(
        "auto-create topics",
        check_kafka_kraft,
        lambda c: put(c, f"{KAFKA_ENV}/KAFKA_AUTO_CREATE_TOPICS_ENABLE", "true"),
    ),
    Breakage(
        "offsets replicated 3",
        check_kafka_kraft,
        lambda c: put(c, f"{KAFKA_ENV}/KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR", 3),
    ),
    Breakage(
        "log dirs off the volume",
        check_kafka_kraft,
        lambda c: put(c, f"{KAFKA_ENV}/KAFKA_LOG_DIRS", "/tmp/kraft-combined-logs"),
    ),
    Breakage(
        "database on localhost",
        check_sluicegate_env,
        lambda c: put(
            c,
            "services/relay/environment/SLUICEGATE_DATABASE_URL",
            "postgresql://sluicegate:sluicegate@localhost:5432/sluicegate",
        ),
    ),
    Breakage(
        "wrong database name",
        check_sluicegate_env,
        lambda c: put(
            c,
            "services/migrate/environment/SLUICEGATE_DATABASE_URL",
            "postgresql://sluicegate:sluicegate@postgres:5432/postgres",
        ),
    ),
    Breakage(
        "no database url",
        check_sluicegate_env,
        lambda c: drop(c, "services/worker/environment/SLUICEGATE_DATABASE_URL"),
    ),
    Breakage(
        "kafka on localhost",
        check_sluicegate_env,
        lambda c: put(
            c, "services/worker/environment/SLUICEGATE_KAFKA_BOOTSTRAP_SERVERS", "localhost:9092"
        ),
    ),
    Breakage(
        "partitions disagree",
        check_partitions,
        lambda c: put(c, f"{KAFKA_ENV}/KAFKA_NUM_PARTITIONS", 3),
    ),
    Breakage(
        "api starts before migrations end",
        check_roles_wait_for_migrations,
        lambda c: put(c, "services/api/depends_on/migrate/condition", "service_started"),
    ),
    Breakage(
        "relay depends_on short form",
        check_roles_wait_for_migrations,
        lambda c: put(c, "services/relay/depends_on", ["migrate", "kafka"]),
    ),
    Breakage(
        "worker does not wait",
        check_roles_wait_for_migrations,
        lambda c: drop(c, "services/worker/depends_on"),
    ),
    Breakage(
        "unquoted restart no",
        check_roles_wait_for_migrations,
        lambda c: put(c, "services/migrate/restart", False),
    ),
    Breakage("api on 8080", check_api, lambda c: put(c, "services/api/ports", ["8080:8080"])),
    Breakage("api without healthcheck", check_api, lambda c: drop(c, "services/api/healthcheck")),
    Breakage("no gpu", check_workers, lambda c: drop(c, "services/worker/deploy")),
    Breakage(
        "amd gpu",
        check_workers,
        lambda c: put(c, "services/worker/deploy/resources/reservations/devices/0/driver", "amd"),
    ),
    Breakage(
        "worker on the simulator",
        check_workers,
        lambda c: put(c, "services/worker/environment/SLUICEGATE_ENGINE", "sim"),
    ),
    Breakage("no vllm extra", check_workers, lambda c: drop(c, "services/worker/build/args")),
    Breakage(
        "past the knee",
        check_workers,
        lambda c: put(
            c, "services/worker/environment/SLUICEGATE_VLLM_GPU_MEMORY_UTILIZATION", "0.98"
        ),
    ),
    Breakage(
        "model cache in the container",
        check_workers,
        lambda c: drop(c, "services/worker/volumes"),
    ),
    Breakage(
        "short grace", check_workers, lambda c: put(c, "services/worker/stop_grace_period", "10s")
    ),
    Breakage(
        "sim worker always on", check_workers, lambda c: drop(c, "services/sim-worker/profiles")
    ),
    Breakage(
        "postgres without volume",
        check_state_and_health,
        lambda c: drop(c, "services/postgres/volumes"),
    ),
    Breakage(
        "kafka without healthcheck",
        check_state_and_health,
        lambda c: drop(c, "services/kafka/healthcheck"),
    ),
    Breakage(
        "depends on a missing service",
        check_references,
        lambda c: put(c, "services/api/depends_on/kafka-broker", {"condition": "service_started"}),
    ),
    Breakage(
        "healthy without a healthcheck",
        check_references,
        lambda c: drop(c, "services/kafka/healthcheck"),
    ),
    Breakage(
        "undeclared volume",
        check_references,
        lambda c: put(c, "services/worker/volumes", ["hf-cache:/models"]),
    ),
    Breakage("relay never restarts", check_lifecycle, lambda c: drop(c, "services/relay/restart")),
    Breakage(
        "worker stopped by SIGKILL",
        check_lifecycle,
        lambda c: put(c, "services/worker/stop_signal", "SIGKILL"),
    ),
]


@pytest.mark.parametrize("breakage", BREAKAGES, ids=lambda b: b.id)
def test_broken_compose_is_rejected(breakage: Breakage) -> None:
    compose = load_compose()
    breakage.check(copy.deepcopy(compose))  # passes on the real file...
    breakage.mutate(compose)
    with pytest.raises(BROKEN):  # ...and fails on the broken one
        breakage.check(compose)


def test_every_compose_check_has_a_breakage() -> None:
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
