"""One local stack per data directory.

``up`` and ``demo`` hold an exclusive ``flock`` on ``data_dir/stack.lock`` for as long as they
run, taken before anything starts. The file says who holds it: the pid, the API's URL and the
pids of the processes that stack started. The kernel drops the lock when its holder dies, even
by ``kill -9``; the next stack then finds the file and the processes the dead one left behind
(its children run in sessions of their own, and its PostgreSQL keeps running), and stops those
before it starts its own. A second stack while the first runs touches nothing and says which
stack holds the directory.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

LOCK_FILE = "stack.lock"
ORPHAN_GRACE_S = 10.0


class StackRunning(Exception):
    """Another stack holds the data directory."""


@dataclass
class DataDirLock:
    data_dir: Path
    _file: IO[str] | None = None
    _record: dict[str, Any] = field(default_factory=dict)

    @property
    def path(self) -> Path:
        return self.data_dir / LOCK_FILE

    def acquire(self, *, api_url: str) -> list[int]:
        """Take the directory; returns the pids a dead stack left (see ``stop_orphans``).
        StackRunning if a live stack holds it."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        handle = self.path.open("a+", encoding="utf-8")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read(handle)
            handle.close()
            raise StackRunning(
                f"a sluicegate stack already runs on {self.data_dir} "
                f"(pid {holder.get('pid', '?')}, API {holder.get('api', '?')}): stop it first "
                "(Ctrl-C where it runs), or give this one its own SLUICEGATE_DATA_DIR"
            ) from None
        left = [int(pid) for pid in _read(handle).get("children", [])]
        self._file = handle
        self._record = {"pid": os.getpid(), "api": api_url, "children": []}
        self._write()
        return left

    def children(self, pids: Iterable[int]) -> None:
        """Record the processes this stack runs (a later stack stops them if we die)."""
        self._record["children"] = sorted(pids)
        self._write()

    def release(self) -> None:
        if self._file is not None:
            self._record["children"] = []
            self._write()
            self._file.close()  # the lock goes with the file
            self._file = None

    def _write(self) -> None:
        assert self._file is not None
        self._file.seek(0)
        self._file.truncate()
        self._file.write(json.dumps(self._record))
        self._file.flush()


def _read(handle: IO[str]) -> dict[str, Any]:
    handle.seek(0)
    try:
        record = json.loads(handle.read() or "{}")
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}


def stop_orphans(pids: Iterable[int]) -> list[int]:
    """SIGTERM the processes a dead stack left (only those still running a sluicegate or
    broker command line), then SIGKILL what is left after a grace; returns those stopped."""
    ours = [pid for pid in pids if _is_stack_process(pid)]
    for pid in ours:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + ORPHAN_GRACE_S
    while time.monotonic() < deadline and any(alive(pid) for pid in ours):
        time.sleep(0.1)
    for pid in ours:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return ours


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and ") Z" in stat.read_text())  # a zombie is gone


def _is_stack_process(pid: int) -> bool:
    """Whether ``pid`` still runs one of the stack's programs (a recycled pid does not)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return False
    return any(name in cmdline for name in (b"sluicegate", b"tansu", b"kafka.Kafka"))
