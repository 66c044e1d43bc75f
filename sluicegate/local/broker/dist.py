"""Apache Kafka's broker, fetched from Maven Central: ``sluicegate kafka pull``.

The broker is ``org.apache.kafka:kafka_2.13`` with its runtime dependencies, plus the logging
its pom leaves out (``log4j-core``, ``log4j-slf4j-impl``, the versions the release ships) and
``kafka-tools`` (``kafka-consumer-groups`` and the other command-line tools). Maven resolves
them (``--strict-checksums``: each jar against the registry's checksum) into a temporary
folder; every jar is then checked against the sha256 pinned in ``kafka-<version>.sha256``
beside this module, and the set must be exactly the pinned one. Only then is the folder
renamed into place, so a half-done pull never looks like a whole one. Nothing else fetches
the broker: the local stack and the tests only read the folder.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from schemas.errors import SluicegateError
from sluicegate.local.model import sha256_of
from sluicegate.local.pull_errors import ChecksumMismatch, DownloadFailed

KAFKA_VERSION = "4.1.2"
LOG4J_VERSION = "2.24.3"
DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
CENTRAL = "https://repo.maven.apache.org/maven2"
MIN_JAVA = 17
MVN_TIMEOUT_S = 900

ARTIFACTS = (
    ("org.apache.kafka", "kafka_2.13", KAFKA_VERSION),
    ("org.apache.kafka", "kafka-tools", KAFKA_VERSION),
    ("org.apache.logging.log4j", "log4j-core", LOG4J_VERSION),
    ("org.apache.logging.log4j", "log4j-slf4j-impl", LOG4J_VERSION),
)


class KafkaUnavailable(SluicegateError):
    """Apache Kafka cannot be fetched or run here."""

    code = "kafka_unavailable"
    status = 503


class JavaMissing(KafkaUnavailable):
    code = "java_missing"


class JavaTooOld(KafkaUnavailable):
    code = "java_too_old"


class MavenMissing(KafkaUnavailable):
    code = "maven_missing"


class NotPulled(KafkaUnavailable):
    code = "kafka_not_pulled"


@dataclass(frozen=True, kw_only=True)
class Java:
    path: Path
    major: int


@dataclass(frozen=True, kw_only=True)
class Pulled:
    home: Path
    jars: int
    bytes: int
    seconds: float
    fetched: bool  # False: it was already here


def pinned() -> dict[str, str]:
    """The jars of the pinned version: file name -> sha256."""
    text = resources.files(__package__).joinpath(f"kafka-{KAFKA_VERSION}.sha256").read_text()
    found = {}
    for line in text.splitlines():
        if line.strip():
            digest, name = line.split()
            found[name] = digest
    return found


def kafka_home(data_dir: Path) -> Path:
    """Where ``pull`` puts the broker: ``<data dir>/kafka/<version>`` (jars under ``libs/``)."""
    return data_dir / "kafka" / KAFKA_VERSION


def find_java(java: Path | None = None, *, java_home: str | None = None) -> Java:
    """The ``java`` to run the broker with, at least ``MIN_JAVA``: ``java`` if given, else
    ``$JAVA_HOME/bin/java``, else ``java`` on PATH."""
    if java is None:
        if java_home:
            java = Path(java_home) / "bin" / "java"
        elif found := shutil.which("java"):
            java = Path(found)
        else:
            raise JavaMissing(f"no java on PATH: Apache Kafka needs Java {MIN_JAVA} or newer")
    try:
        done = subprocess.run(
            [str(java), "-version"], capture_output=True, text=True, timeout=30, check=False
        )
    except OSError as exc:
        raise JavaMissing(f"{java} cannot run: {exc.strerror}") from None
    major = java_major(done.stderr + done.stdout)
    if major is None:
        raise JavaMissing(f"{java} -version did not say its version")
    if major < MIN_JAVA:
        raise JavaTooOld(f"{java} is Java {major}: Apache Kafka needs Java {MIN_JAVA} or newer")
    return Java(path=java, major=major)


def java_major(version_text: str) -> int | None:
    """The major version in ``java -version``'s output: ``"1.8.0_392"`` is 8, ``"17.0.15"``
    is 17, ``"21"`` is 21."""
    found = re.search(r'version "(\d+)(?:\.(\d+))?', version_text)
    if found is None:
        return None
    major = int(found.group(1))
    return int(found.group(2) or 0) if major == 1 else major


def find_mvn() -> str:
    if (mvn := shutil.which("mvn")) is None:
        raise MavenMissing("no mvn on PATH: `sluicegate kafka pull` resolves the broker with Maven")
    return mvn


def is_pulled(home: Path) -> bool:
    """Whether ``home`` holds the pinned jars (by name: ``pull`` checked each one's sha256
    before it put them there)."""
    libs = home / "libs"
    return libs.is_dir() and {p.name for p in libs.glob("*.jar")} == set(pinned())


def pull(home: Path, *, repository: str = CENTRAL, java_home: str | None = None) -> Pulled:
    """The broker in ``home`` (``kafka_home(data_dir)`` by default), resolved and checked
    unless it is already there."""
    started = time.monotonic()
    if is_pulled(home):
        return _pulled(home, started, fetched=False)
    find_java(java_home=java_home)
    mvn = find_mvn()
    home.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".pull-", dir=home.parent) as tmp:
        libs = Path(tmp) / "libs"
        resolve(mvn, Path(tmp), libs, repository=repository)
        check(libs)
        if home.exists():
            shutil.rmtree(home)  # a partial or other folder: replaced whole
        home.mkdir()
        libs.replace(home / "libs")
    return _pulled(home, started, fetched=True)


def _pulled(home: Path, started: float, *, fetched: bool) -> Pulled:
    jars = list((home / "libs").glob("*.jar"))
    return Pulled(
        home=home,
        jars=len(jars),
        bytes=sum(p.stat().st_size for p in jars),
        seconds=time.monotonic() - started,
        fetched=fetched,
    )


def pom(repository: str) -> str:
    dependencies = "".join(
        f"<dependency><groupId>{g}</groupId><artifactId>{a}</artifactId>"
        f"<version>{v}</version></dependency>"
        for g, a, v in ARTIFACTS
    )
    repo = f"<id>central</id><url>{repository}</url>"
    return (
        '<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
        "<groupId>sluicegate</groupId><artifactId>kafka-pull</artifactId><version>0</version>"
        f"<repositories><repository>{repo}</repository></repositories>"
        f"<pluginRepositories><pluginRepository>{repo}</pluginRepository></pluginRepositories>"
        f"<dependencies>{dependencies}</dependencies></project>"
    )


def resolve(mvn: str, work: Path, libs: Path, *, repository: str) -> None:
    """Maven copies the artifacts and their runtime dependencies into ``libs``."""
    (work / "pom.xml").write_text(pom(repository), encoding="utf-8")
    command = [
        mvn,
        "--batch-mode",
        "--no-transfer-progress",
        "--strict-checksums",
        "-f",
        str(work / "pom.xml"),
        f"{DEPENDENCY_PLUGIN}:copy-dependencies",
        f"-DoutputDirectory={libs}",
        "-DincludeScope=runtime",
    ]
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=MVN_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        raise DownloadFailed("kafka", f"Maven did not finish in {MVN_TIMEOUT_S} s") from None
    if done.returncode != 0:
        why = _first_error(done.stdout + done.stderr)
        raise DownloadFailed(
            "kafka", f"Maven could not resolve Apache Kafka {KAFKA_VERSION}: {why}"
        )


def _first_error(output: str) -> str:
    """Maven's first ``[ERROR]`` line, shortened."""
    for line in output.splitlines():
        if line.startswith("[ERROR]") and len(line) > len("[ERROR] "):
            text = line.removeprefix("[ERROR]").strip()
            return text if len(text) <= 400 else text[:397] + "..."
    return f"mvn exited without an error line ({output.strip()[-200:]!r})"


def check(libs: Path) -> None:
    """Every jar is a pinned one with its pinned sha256, and none is missing."""
    expected = pinned()
    found = {p.name: p for p in libs.glob("*.jar")}
    if missing := sorted(set(expected) - set(found)):
        raise ChecksumMismatch(
            "kafka", f"{len(missing)} pinned jars were not resolved: {missing[:3]}"
        )
    if extra := sorted(set(found) - set(expected)):
        raise ChecksumMismatch(
            "kafka", f"{len(extra)} jars resolved that are not pinned: {extra[:3]}"
        )
    for name, path in sorted(found.items()):
        if (digest := sha256_of(path)) != expected[name]:
            raise ChecksumMismatch(
                "kafka", f"{name} has sha256 {digest}, expected {expected[name]}"
            )
