"""The checks of docker-compose.yml, and of the Dockerfile and .dockerignore its Sluicegate
services are built with."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from urllib.parse import urlsplit

import yaml

from sluicegate.local.broker.apache import SHARED_SETTINGS
from sluicegate.local.broker.dist import KAFKA_VERSION
from tests.unit.deploy.files import (
    ONE_SHOT,
    ROOT,
    Compose,
    bind_mounts,
    cli_args,
    depends,
    dockerfile_instructions,
    env,
    gpu_devices,
    is_named_volume,
    listeners,
    long_running,
    metrics_port,
    mounts,
    named_mount_targets,
    replicas,
    resolve,
    seconds,
    settings_of,
    sluicegate_services,
)

CORE = (
    "kafka",
    "postgres",
    "migrate",
    "api",
    "gateway",
    "relay",
    "webhooks",
    "worker",
    "prometheus",
    "grafana",
)
SLUICEGATE_CORE = ("migrate", "api", "relay", "webhooks", "worker")
# The checks of docker-compose.yml


def check_services(compose: Compose) -> None:
    services = compose["services"]
    missing = set(CORE) - set(services)
    assert not missing, f"missing services: {sorted(missing)}"
    for name in SLUICEGATE_CORE:
        assert name in sluicegate_services(compose), f"{name} is not built from this repository"
        assert services[name]["command"][0] == name, f"{name} does not run `sluicegate {name}`"


def check_cli_roles(compose: Compose) -> None:
    """Every Sluicegate service runs a role of the ``sluicegate`` command with options it
    takes, and every role a deployment needs is run."""
    roles = {
        name: cli_args(service).command for name, service in sluicegate_services(compose).items()
    }
    needed = {"api", "relay", "worker", "webhooks", "migrate"}
    # A service, not a client: `up`, `demo`, `submit`, `summarize` and `keys` are not roles.
    assert set(roles.values()) <= needed | {"sim-server"}, f"not a service role: {roles}"
    assert needed <= set(roles.values()), f"never run: {sorted(needed - set(roles.values()))}"


def check_settings(compose: Compose) -> None:
    """Every SLUICEGATE_* variable is a field of Settings, with a value it accepts."""
    for name, service in compose["services"].items():
        try:
            settings_of(service)
        except ValueError as exc:  # pydantic's ValidationError
            raise AssertionError(f"{name}: {exc}") from exc


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


def check_kafka_is_the_tested_one(compose: Compose) -> None:
    """The broker of the compose file is the version the tests run and `sluicegate kafka
    pull` fetches, with the broker settings the tests run it with."""
    kafka = compose["services"]["kafka"]
    assert kafka["image"] == f"apache/kafka:{KAFKA_VERSION}", kafka["image"]
    e = env(kafka)
    for key, value in SHARED_SETTINGS.items():
        name = "KAFKA_" + key.upper().replace(".", "_")
        assert e.get(name) == value, f"{name} is {e.get(name)!r}; the tests run with {value!r}"
    # One static voter, itself, as the embedded broker runs (controller.quorum.voters).
    assert e["KAFKA_CONTROLLER_QUORUM_VOTERS"] == f"{e['KAFKA_NODE_ID']}@kafka:9093"


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
    for name, service in long_running(compose).items():
        wait = depends(service)
        assert wait.get("migrate") == "service_completed_successfully", name
        assert wait.get("kafka") == "service_healthy", name


def check_api(compose: Compose) -> None:
    """One uvicorn process per API container (its /metrics is then the whole process's), as
    many containers as wanted behind the gateway, so none publishes a port itself."""
    api = compose["services"]["api"]
    command = api["command"]
    for flag, value in (("--host", "0.0.0.0"), ("--port", "8000")):
        assert command[command.index(flag) + 1] == value, flag
    assert cli_args(api).workers == 1, "several processes would share one metrics target"
    assert replicas(api) >= 2, "one API process for the whole stack"
    assert "ports" not in api, "replicas cannot share a published port: publish the gateway's"
    assert "8000" in [str(port) for port in api["expose"]], api.get("expose")
    assert "/healthz" in " ".join(api["healthcheck"]["test"])


def check_metrics_endpoints(compose: Compose) -> None:
    """Every long-running process serves metrics on a port its container exposes, and its
    healthcheck asks that process on that port."""
    for name, service in long_running(compose).items():
        port = metrics_port(service)
        assert str(port) in [str(p) for p in service.get("expose", [])], f"{name}: {port} hidden"
        probe = " ".join(service["healthcheck"]["test"])
        assert f"127.0.0.1:{port}/" in probe, f"{name}: the healthcheck asks another port"


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


def check_gpu_workers(compose: Compose) -> None:
    """Every vLLM worker has a GPU of its own: Docker gives ``count: N`` the first N GPUs, so
    two services (or replicas) with a count would share GPU 0 and run out of memory."""
    held: dict[str, str] = {}
    vllm = {
        name: service
        for name, service in long_running(compose).items()
        if settings_of(service).engine == "vllm_local"
    }
    assert vllm, "no GPU worker"
    for name, service in vllm.items():
        devices = gpu_devices(service)
        assert devices, f"{name} reserves no NVIDIA GPU"
        assert replicas(service) == 1, f"{name}: replicas would share its GPU"
        for device in devices:
            assert not {"count", "device_ids"} <= set(device), f"{name}: Docker takes one"
            if "count" in device:
                assert len(vllm) == 1, f"{name}: a count takes GPU 0 whatever the others hold"
            for gpu in map(str, device.get("device_ids", [])):
                assert gpu not in held, f"{name} and {held[gpu]} share GPU {gpu}"
                held[gpu] = name
        assert settings_of(service).vllm_gpu_memory_utilization <= 0.9, f"{name}: past the knee"


def check_pools(compose: Compose) -> None:
    """Every Sluicegate service reads the same pools (SLUICEGATE_POOLS), every worker joins
    one of them, and every pool has a worker in each way of running the stack: the GPU
    workers (no profile) serve every pool, and so do the simulator workers of the cpu
    profile."""
    services = sluicegate_services(compose)
    named = {name: tuple(settings_of(service).pools) for name, service in services.items()}
    assert len(set(named.values())) == 1, f"the services disagree on the pools: {named}"
    pools = next(iter(named.values()))
    assert len(pools) >= 2, "the compose file shows one model per pool: give it two"
    served: dict[tuple[str, ...], set[str]] = {}
    for name, service in long_running(compose).items():
        if cli_args(service).command != "worker":
            continue
        model = settings_of(service).worker_model or pools[0]
        assert model in pools, f"{name} joins {model!r}, which is no pool"
        served.setdefault(tuple(sorted(service.get("profiles", []))), set()).add(model)
    for profiles, models in served.items():
        missing = sorted(set(pools) - models)
        assert not missing, f"profiles {list(profiles)}: no worker of {missing}"


def check_stop_grace(compose: Compose) -> None:
    """Docker's SIGKILL comes only after each role's own shutdown limit."""
    for name, service in long_running(compose).items():
        settings = settings_of(service)
        role = cli_args(service).command
        needed = {
            "api": settings.api_shutdown_timeout_s,
            "relay": settings.relay_send_timeout_s,
            "worker": settings.drain_timeout_s,
            "webhooks": settings.webhook_timeout_s,
        }[role]
        grace = seconds(service.get("stop_grace_period", "10s"))
        assert needed < grace, f"{name}: {needed} s of shutdown, {grace} s before SIGKILL"


def check_state_and_health(compose: Compose) -> None:
    for name in ("kafka", "postgres"):
        service = compose["services"][name]
        assert named_mount_targets(service), f"{name} keeps its data in the container"
        test = service["healthcheck"]["test"]
        assert test[0] in ("CMD", "CMD-SHELL"), f"{name} has no healthcheck"
    assert "pg_isready" in " ".join(compose["services"]["postgres"]["healthcheck"]["test"])
    for name, service in compose["services"].items():
        if name != ONE_SHOT:
            assert service["healthcheck"]["test"][0] in ("CMD", "CMD-SHELL"), name


def check_volumes(compose: Compose) -> None:
    """What must survive a new container lives on a named volume."""
    services = compose["services"]
    storage = [
        arg.split("=", 1)[1]
        for arg in services["prometheus"]["command"]
        if arg.startswith("--storage.tsdb.path=")
    ]
    needed = {
        "postgres": env(services["postgres"]).get("PGDATA", "/var/lib/postgresql/data"),
        "kafka": env(services["kafka"])["KAFKA_LOG_DIRS"],
        "worker": env(services["worker"])["HF_HOME"],
        "prometheus": storage[0],
        "grafana": "/var/lib/grafana",
    }
    for name, path in needed.items():
        assert path in named_mount_targets(services[name]), f"{name}: {path} is not on a volume"


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
        for target, path in bind_mounts(service).items():
            assert path.exists(), f"{name} mounts missing {path.relative_to(ROOT)} at {target}"


def check_lifecycle(compose: Compose) -> None:
    # PostgreSQL's fast shutdown is SIGINT (its image's own stop signal); SIGTERM for it
    # would wait for every pooled client connection to close. nginx's graceful one is SIGQUIT.
    signals = {"postgres": "SIGINT", "gateway": "SIGQUIT"}
    for name, service in compose["services"].items():
        if name == ONE_SHOT:
            continue
        assert service.get("restart") == "unless-stopped", name
        assert service.get("stop_signal") == signals.get(name, "SIGTERM"), name


def check_pinned_images(compose: Compose) -> None:
    for name, service in compose["services"].items():
        if "build" in service:
            continue
        image = service["image"]
        tag = image.rpartition(":")[2] if ":" in image.rpartition("/")[2] else ""
        # A release (postgres keeps its major version, the one its data directory is for).
        assert re.fullmatch(r"v?\d+(\.\d+)*(-\w+)?", tag), f"{name}: {image} is not pinned"


COMPOSE_CHECKS: list[Callable[[Compose], None]] = [
    check_services,
    check_cli_roles,
    check_settings,
    check_kafka_kraft,
    check_kafka_is_the_tested_one,
    check_sluicegate_env,
    check_partitions,
    check_roles_wait_for_migrations,
    check_api,
    check_metrics_endpoints,
    check_workers,
    check_gpu_workers,
    check_pools,
    check_stop_grace,
    check_state_and_health,
    check_volumes,
    check_references,
    check_lifecycle,
    check_pinned_images,
]


# ---------------------------------------------------------------------------------------------
# The image the Sluicegate services are built from


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
