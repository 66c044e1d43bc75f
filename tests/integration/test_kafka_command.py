"""`sluicegate kafka pull` and `sluicegate kafka run` as a user runs them: what is missing
(java, a new enough java, mvn, the registry) is one line with a stable code and a non-zero
exit; a second pull does nothing; the broker stops on SIGTERM with a controlled shutdown
and exit 0. Nothing here downloads: the registry failure is a registry that is not there."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from sluicegate.local.broker import dist
from sluicegate.local.broker.apache import new_cluster_id
from sluicegate.local.embedded import free_port
from sluicegate.local.pull_errors import ChecksumMismatch
from tests.support import brokers

pytestmark = pytest.mark.timeout(120)


def sluicegate(*args: str, env: dict[str, str], timeout_s: float = 90) -> tuple[int, list[str]]:
    done = subprocess.run(
        [sys.executable, "-m", "sluicegate", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    return done.returncode, lines


def env_with(data_dir: Path, path: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICEGATE_")}
    env.pop("JAVA_HOME", None)
    return {**env, "SLUICEGATE_DATA_DIR": str(data_dir), "PATH": path, **extra}


def a_bin(directory: Path, **programs: str) -> str:
    """A PATH folder holding the given programs (name -> the real path or a script)."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, target in programs.items():
        if target.startswith("#!"):
            (directory / name).write_text(target)
            (directory / name).chmod(0o755)
        else:
            (directory / name).symlink_to(target)
    return str(directory)


def real(program: str) -> str:
    found = shutil.which(program)
    assert found is not None, f"{program} is not on this machine's PATH"
    return os.path.realpath(found)


def test_without_java_pull_says_so_in_one_line(tmp_path: Path) -> None:
    code, lines = sluicegate("kafka", "pull", env=env_with(tmp_path, "/nonexistent"))
    assert code != 0
    assert lines == [
        "kafka pull failed (java_missing): no java on PATH: Apache Kafka needs Java 17 or newer"
    ]


def test_a_java_older_than_17_is_refused_by_its_version(tmp_path: Path) -> None:
    old = "#!/bin/sh\necho 'openjdk version \"11.0.22\" 2024-01-16' >&2\n"
    path = a_bin(tmp_path / "bin", java=old, mvn=real("mvn"))
    code, lines = sluicegate("kafka", "pull", env=env_with(tmp_path, path))
    assert code != 0
    assert len(lines) == 1, lines
    assert lines[0].startswith("kafka pull failed (java_too_old): ")
    assert "is Java 11: Apache Kafka needs Java 17 or newer" in lines[0]


def test_without_mvn_pull_says_so_in_one_line(tmp_path: Path) -> None:
    path = a_bin(tmp_path / "bin", java=real("java"))
    code, lines = sluicegate("kafka", "pull", env=env_with(tmp_path, path))
    assert code != 0
    assert len(lines) == 1, lines
    assert lines[0].startswith("kafka pull failed (maven_missing): no mvn on PATH")


def test_a_registry_that_does_not_answer_fails_the_pull_and_leaves_nothing(tmp_path: Path) -> None:
    env = env_with(
        tmp_path,
        os.environ["PATH"],
        SLUICEGATE_KAFKA_REPOSITORY="http://127.0.0.1:9/maven2",
        # Maven's own cache is a new, empty one: nothing can come from an earlier pull.
        MAVEN_OPTS=f"-Dmaven.repo.local={tmp_path / 'm2'}",
    )
    code, lines = sluicegate("kafka", "pull", env=env)
    assert code != 0
    assert lines[0].startswith("pulling Apache Kafka 4.1.2"), lines
    assert len(lines) == 2, lines
    assert lines[1].startswith("kafka pull failed (kafka_download_failed): Maven could not ")
    assert "127.0.0.1:9" in lines[1]
    assert not dist.kafka_home(tmp_path).exists()
    assert not list((tmp_path / "kafka").glob(".pull-*"))  # its work folder is gone too


def test_a_second_pull_finds_the_broker_and_does_nothing(tmp_path: Path) -> None:
    home = brokers.kafka_home()
    # No mvn on the PATH: a pull that found the broker does not need it.
    env = env_with(tmp_path, "/nonexistent", SLUICEGATE_KAFKA_HOME=str(home))
    code, lines = sluicegate("kafka", "pull", env=env)
    assert code == 0, lines
    assert lines == [f"Apache Kafka 4.1.2 already here: {home} (93 jars, 53.7 MiB)"]


def test_the_pinned_jars_are_checked_one_by_one(tmp_path: Path) -> None:
    libs = tmp_path / "libs"
    libs.mkdir()
    home = brokers.kafka_home()
    for jar in (home / "libs").glob("*.jar"):
        (libs / jar.name).symlink_to(jar)
    dist.check(libs)  # the pulled set passes

    tampered = libs / "kafka-clients-4.1.2.jar"
    tampered.unlink()
    tampered.write_bytes(b"not the jar")
    with pytest.raises(ChecksumMismatch, match=r"kafka-clients-4.1.2.jar has sha256 "):
        dist.check(libs)
    tampered.unlink()
    with pytest.raises(ChecksumMismatch, match="1 pinned jars were not resolved"):
        dist.check(libs)
    (libs / "kafka-clients-4.1.2.jar").symlink_to(home / "libs" / "kafka-clients-4.1.2.jar")
    (libs / "evil-1.0.jar").write_bytes(b"")
    with pytest.raises(ChecksumMismatch, match=r"jars resolved that are not pinned"):
        dist.check(libs)


def test_kafka_run_serves_until_sigterm_then_shuts_down_cleanly(tmp_path: Path) -> None:
    port, controller = free_port(), free_port()
    env = env_with(
        tmp_path,
        os.environ["PATH"],
        SLUICEGATE_KAFKA_HOME=str(brokers.kafka_home()),
        SLUICEGATE_KAFKA_HEAP_MB=str(brokers.HEAP_MB),
    )
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sluicegate",
            "kafka",
            "run",
            "--port",
            str(port),
            "--controller-port",
            str(controller),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert process.stdout is not None
        banner = process.stdout.readline()
        assert re.match(
            rf"Apache Kafka 4\.1\.2 on 127\.0\.0\.1:{port} \(KRaft, broker and controller; "
            rf"log in {tmp_path / 'kafka' / 'data'}\); started in [\d.]+ s, RSS \d+ MiB\.",
            banner,
        ), banner
        # Its log is in the data directory, formatted with a cluster id.
        assert "cluster.id=" in (tmp_path / "kafka" / "data" / "meta.properties").read_text()
        process.send_signal(signal.SIGTERM)
        rest, _ = process.communicate(timeout=90)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, rest
    assert rest.strip() == "Apache Kafka stopped (controlled shutdown)"
    log = (tmp_path / "broker.log").read_text()
    assert "Beginning controlled shutdown." in log  # it asked its controller to leave
    assert "Transition from SHUTTING_DOWN to SHUTDOWN" in log


@pytest.mark.parametrize(
    ("text", "major"),
    [
        ('openjdk version "17.0.15" 2025-04-15', 17),
        ('java version "1.8.0_392"', 8),
        ('openjdk version "21" 2023-09-19', 21),
        ('openjdk version "25-ea" 2025-09-16', 25),
        ("no version here", None),
    ],
)
def test_java_versions_are_read_as_java_prints_them(text: str, major: int | None) -> None:
    assert dist.java_major(text) == major


def test_cluster_ids_never_look_like_a_flag() -> None:
    # One in 64 random ids starts with "-"; 2,000 draws miss that with odds of 1 in 10^13.
    ids = [new_cluster_id() for _ in range(2000)]
    assert not [i for i in ids if i.startswith("-")]
    assert all(len(i) == 22 for i in ids)


def test_kafka_run_on_a_port_in_use_says_so_in_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = env_with(
            tmp_path, os.environ["PATH"], SLUICEGATE_KAFKA_HOME=str(brokers.kafka_home())
        )
        code, lines = sluicegate("kafka", "run", "--port", str(port), env=env)
    assert code == 1
    assert lines == [
        f"Apache Kafka did not start: 127.0.0.1:{port} is in use by another process "
        f"(log: {tmp_path / 'broker.log'})"
    ]
