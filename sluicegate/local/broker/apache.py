"""Apache Kafka as a single KRaft node on loopback, from the jars ``sluicegate kafka pull``
fetched: ``java -cp 'libs/*' kafka.Kafka server.properties``, one process that is both broker
and controller, its log in a folder that outlives it.

The log is formatted once (``kafka.tools.StorageTool format``, which gives it a cluster id);
every later start runs on the same log, so records, committed offsets and the group survive a
restart. The quorum is the one static voter, this node (``controller.quorum.voters``), as in
docker-compose.yml, whose image formats its storage the same way; the controller's address is
read from the settings at each start, so a restart may take other ports. A stop is SIGTERM:
the JVM's shutdown hook makes a controlled shutdown (the log is flushed and closed cleanly)
and the process exits.
"""

from __future__ import annotations

import base64
import shutil
import subprocess
import time
import uuid
from pathlib import Path

from sluicegate.local.broker.base import BrokerInfo, BrokerProcess
from sluicegate.local.broker.dist import KAFKA_VERSION, Java, NotPulled, is_pulled
from sluicegate.local.embedded import EmbeddedError, free_port

# The broker settings the local stack, the tests and docker-compose.yml share (the compose
# file gives them as KAFKA_* variables; tests/unit/deploy checks that they agree).
SHARED_SETTINGS = {
    "process.roles": "broker,controller",
    "node.id": "1",
    "controller.listener.names": "CONTROLLER",
    "inter.broker.listener.name": "PLAINTEXT",
    "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
    "offsets.topic.replication.factor": "1",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "default.replication.factor": "1",
    "min.insync.replicas": "1",
    # A group forms as soon as its first member joins (the default waits 3 s for more).
    "group.initial.rebalance.delay.ms": "0",
    # Worker groups on the consumer protocol (KIP-848): the broker owns their session and
    # heartbeat. A member silent 10 s is out (the classic workers' default), and a move
    # reaches the others within a 1 s heartbeat (the defaults, 45 s and 5 s, are floors).
    "group.consumer.session.timeout.ms": "10000",
    "group.consumer.min.session.timeout.ms": "6000",
    "group.consumer.heartbeat.interval.ms": "1000",
    "group.consumer.min.heartbeat.interval.ms": "1000",
    # Topics are made by the relay and the webhook dispatcher, never by a client naming one.
    "auto.create.topics.enable": "false",
}

# Two cores: fewer request-handling threads than the defaults (3 network, 8 I/O).
LOCAL_SETTINGS = {
    "num.network.threads": "2",
    "num.io.threads": "4",
}

# kafka-run-class.sh's collector settings; the heap is ours (``local_kafka_heap_mb``).
JVM_OPTIONS = [
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-Djava.awt.headless=true",
]

LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = out
logger.state.name = state.change.logger
logger.state.level = WARN
logger.request.name = kafka.request.logger
logger.request.level = WARN
"""


def new_cluster_id() -> str:
    """A cluster id as Kafka makes them (``Uuid.randomUuid``): a random UUID, base64url
    without padding, never starting with "-" (the storage tool would take it for a flag)."""
    while True:
        found = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not found.startswith("-"):
            return found


class ApacheKafka(BrokerProcess):
    """A single-node KRaft broker whose files live in ``root``: ``data/`` (the log),
    ``server.properties`` and ``log4j2.properties`` (written at each start)."""

    stop_grace_s = 60.0  # a controlled shutdown flushes and closes every partition's log

    def __init__(
        self,
        *,
        root: Path,
        home: Path,
        java: Java,
        heap_mb: int = 1024,
        port: int | None = None,
        controller_port: int | None = None,
        log_path: Path | None = None,
    ) -> None:
        super().__init__(port=port or free_port(), log_path=log_path)
        self.root = root
        self.home = home
        self.java = java
        self.heap_mb = heap_mb
        self.controller_port = controller_port or free_port()
        while self.controller_port == self.port:
            self.controller_port = free_port()
        self.info = BrokerInfo(
            kind="kafka", version=KAFKA_VERSION, bootstrap=self.bootstrap, durable=True
        )
        self.started_in_s: float | None = None
        self.new_log = False  # True when the last start found no log and formatted one

    def ports(self) -> list[int]:
        return [self.port, self.controller_port]

    @property
    def data(self) -> Path:
        return self.root / "data"

    def settings(self) -> dict[str, str]:
        listeners = f"PLAINTEXT://{self.bootstrap},CONTROLLER://127.0.0.1:{self.controller_port}"
        return {
            **SHARED_SETTINGS,
            **LOCAL_SETTINGS,
            "listeners": listeners,
            "advertised.listeners": listeners,
            "controller.quorum.voters": f"1@127.0.0.1:{self.controller_port}",
            "log.dirs": str(self.data),
        }

    def _write_config(self) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "log4j2.properties").write_text(LOG4J2, encoding="utf-8")
        config = self.root / "server.properties"
        lines = [f"{key}={value}" for key, value in self.settings().items()]
        config.write_text("\n".join(lines) + "\n", encoding="utf-8")
        return config

    def _java(self, main: str, *args: str, heap: bool = False) -> list[str]:
        memory = [f"-Xms{max(self.heap_mb // 4, 64)}m", f"-Xmx{self.heap_mb}m"] if heap else []
        return [
            str(self.java.path),
            *memory,
            *JVM_OPTIONS,
            f"-Dlog4j2.configurationFile={self.root / 'log4j2.properties'}",
            "-cp",
            str(self.home / "libs" / "*"),
            main,
            *args,
        ]

    def cluster_id(self) -> str | None:
        """The id the log was formatted with; None before it is."""
        meta = self.data / "meta.properties"
        if not meta.exists():
            return None
        for line in meta.read_text(encoding="utf-8").splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "cluster.id":
                return value.strip()
        return None

    def format(self) -> None:
        """Format the log with a new cluster id, unless it already is."""
        config = self._write_config()
        self.new_log = self.cluster_id() is None
        if not self.new_log:
            return
        command = self._java(
            "kafka.tools.StorageTool", "format", "-t", new_cluster_id(), "-c", str(config)
        )
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
        if done.returncode != 0:
            last = (done.stdout + done.stderr).strip().splitlines() or ["no output"]
            raise EmbeddedError(f"Apache Kafka's storage could not be formatted: {last[-1]}")

    async def start(self, timeout_s: float = 60.0) -> None:
        if not is_pulled(self.home):
            raise NotPulled(
                f"Apache Kafka {KAFKA_VERSION} is not in {self.home}: "
                "run `sluicegate kafka pull` first"
            )
        began = time.monotonic()
        self.format()
        self.spawn(self._java("kafka.Kafka", str(self.root / "server.properties"), heap=True))
        await self.wait_ready(timeout_s)
        self.started_in_s = time.monotonic() - began

    async def restart(self, timeout_s: float = 60.0, *, lose_log: bool = False) -> None:
        """Start again on the same ports and the same log; ``lose_log`` starts it on a new,
        empty one (a new cluster id), as a broker whose disk was lost would come back."""
        self.stop()
        if lose_log:
            shutil.rmtree(self.data, ignore_errors=True)
        await self.start(timeout_s)

    def rss_bytes(self) -> int | None:
        """The broker process's resident memory (Linux), None when it does not run."""
        if self.pid is None:
            return None
        try:
            status = Path(f"/proc/{self.pid}/status").read_text()
        except OSError:
            return None
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return None
