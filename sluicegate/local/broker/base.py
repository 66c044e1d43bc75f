"""What the local stack and the tests need of an embedded broker, whichever it is: a process
on loopback that they start, wait for, kill, restart and stop."""

from __future__ import annotations

import asyncio
import re
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Literal, Protocol

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from sluicegate.local.embedded import EmbeddedError

BrokerKind = Literal["kafka", "tansu"]
# A Java exception's message line: "org.apache.kafka.common.KafkaException: Failed to ..."
EXCEPTION = re.compile(r"^(?:[\w$]+\.)+[\w$]*(?:Exception|Error): ")


@dataclass(frozen=True, kw_only=True)
class BrokerInfo:
    """What ``stack.json`` and the banner say of the broker."""

    kind: BrokerKind
    version: str
    bootstrap: str
    durable: bool  # False: its log is lost when it stops


class Broker(Protocol):
    info: BrokerInfo
    # Whether the last start began a new log (nothing of an earlier one is there): Tansu's
    # always; Apache Kafka's when that start formatted it (a first start, or a lost log).
    new_log: bool

    @property
    def bootstrap(self) -> str: ...

    @property
    def pid(self) -> int | None: ...

    async def start(self, timeout_s: float = ...) -> None: ...

    async def restart(self, timeout_s: float = ...) -> None:
        """Start again on the same address (on the same log where the broker keeps one)."""
        ...

    def stop(self) -> None: ...

    def kill(self) -> None: ...

    def wait(self) -> int | None: ...


class BrokerProcess:
    """A broker's process: spawned in a session of its own (a signal to our group does not
    reach it), its output appended to ``log_path``."""

    stop_grace_s: float = 5.0

    def __init__(self, *, port: int, log_path: Path | None) -> None:
        self.port = port
        self.log_path = log_path
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._log_from = 0  # where this start's output begins in the log

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def spawn(self, command: list[str]) -> None:
        """Start the process; refused at once when its port is taken (a client would find
        whatever answers there and take it for this broker)."""
        for port in self.ports():
            if not port_free(port):
                raise EmbeddedError(f"127.0.0.1:{port} is in use by another process")
        if self.log_path is not None:
            self._log = open(self.log_path, "ab")  # noqa: SIM115 (kept open)
            self._log_from = self._log.tell()
        self._process = subprocess.Popen(
            command,
            stdout=self._log or subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def ports(self) -> list[int]:
        """The loopback ports the broker listens on."""
        return [self.port]

    def exit_code(self) -> int | None:
        return self._process.poll() if self._process is not None else None

    async def wait_ready(self, timeout_s: float) -> None:
        """Until the broker answers a Kafka client with at least one broker in its metadata."""
        deadline = time.monotonic() + timeout_s
        while True:
            if (code := self.exit_code()) is not None:
                raise EmbeddedError(f"the broker exited with code {code}{self.last_line()}")
            if await answers(self.bootstrap):
                return
            if time.monotonic() > deadline:
                raise EmbeddedError(
                    f"the broker did not answer on {self.bootstrap} in {timeout_s:.0f} s"
                )
            await asyncio.sleep(0.1)

    def last_line(self) -> str:
        """What this start's output says went wrong: the first exception's message (a JVM
        logs its cause there, not last), else its last line."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        with self.log_path.open("rb") as f:
            f.seek(self._log_from)
            lines = f.read().decode(errors="replace").strip().splitlines()
        for line in lines:
            if EXCEPTION.match(line):
                return f": {line.strip()}"
        return f": {lines[-1].strip()}" if lines else ""

    def stop(self) -> None:
        """SIGTERM, ``stop_grace_s`` to exit, then SIGKILL."""
        self.terminate()

    def terminate(self) -> int | None:
        """``stop``, returning the process's exit status (None if it was not running)."""
        process, self._process = self._process, None
        code = None
        if process is not None:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(self.stop_grace_s)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
            code = process.returncode
        if self._log is not None:
            self._log.close()
            self._log = None
        return code

    def kill(self) -> None:
        """A crash: SIGKILL, no goodbye."""
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait()
        self.stop()

    def wait(self) -> int | None:
        """Block until the process exits; None if it is not running."""
        process = self._process
        return process.wait() if process is not None else None


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


async def answers(bootstrap: str) -> bool:
    """Whether a Kafka client gets metadata naming a broker at ``bootstrap``."""
    host, _, port = bootstrap.rpartition(":")
    try:
        _, writer = await asyncio.open_connection(host, int(port))
    except OSError:
        return False
    writer.close()
    await writer.wait_closed()
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=2000)
    try:
        await admin.start()
        return bool((await admin.describe_cluster()).get("brokers"))
    except (KafkaError, OSError):
        return False
    finally:
        await admin.close()
