"""Logging for every process: one format that names the process's role, quiet libraries, and
one line for a burst of the same event.

Each line reads ``TIME LEVEL ROLE LOGGER: MESSAGE``, where ROLE is what the entry point
named the process (``api``, ``relay``, ``worker-1``, ``webhooks``, ``llama-1``, ``up``...).
The role is the process's ``multiprocessing`` name, which ``logging`` records as
``processName``.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import multiprocessing
import time
from collections.abc import Callable
from typing import Any

FORMAT = "%(asctime)s %(levelname)s %(processName)s %(name)s: %(message)s"

QUIET = ("aiokafka", "httpx", "httpcore")
"""Libraries whose INFO lines say nothing a user acts on."""

ASKED_ONLY = ("alembic",)
"""Libraries heard only at DEBUG: Alembic's migration steps (a dozen lines at every start)."""


def set_role(role: str) -> None:
    """Name this process in every log line it writes from now on."""
    multiprocessing.current_process().name = role


def configure(level: str, role: str) -> None:
    """The root logger at ``level`` in the house format, this process named ``role``."""
    set_role(role)
    level = level.upper()
    logging.basicConfig(level=level, format=FORMAT)
    for noisy in QUIET:
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # A few lines per rebalance: joins, the elected leader, revoked and assigned partitions.
    logging.getLogger("aiokafka.consumer.group_coordinator").setLevel(logging.INFO)
    for name in ASKED_ONLY:
        logging.getLogger(name).setLevel(logging.DEBUG if level == "DEBUG" else logging.WARNING)


def uvicorn_log_config() -> dict[str, Any]:
    """uvicorn's own logging configuration, its lines in the house format (with the role)."""
    from uvicorn.config import LOGGING_CONFIG

    config = copy.deepcopy(LOGGING_CONFIG)
    for formatter in config["formatters"].values():
        formatter.clear()
        formatter["format"] = FORMAT
    return config


class Tally:
    """A burst of the same event in two INFO lines at most, instead of one an event: the
    burst's first event itself, then one line counting the rest.

    ``add`` logs the first event of a burst at INFO (so a lone event, or the last words of a
    process killed mid-burst, is still heard in full) and the others at DEBUG, counting them;
    ``window_s`` after the first (or at ``flush``) one INFO line says how many more there
    were, if any. A batch cancel that fences off hundreds of attempts is two lines.
    """

    def __init__(
        self,
        logger: logging.Logger,
        summary: str,
        *,
        window_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._log = logger
        self._summary = summary  # formatted with count= (the events after the first), seconds=
        self._window_s = window_s
        self._clock = clock
        self._count = 0
        self._since = 0.0
        self._timer: asyncio.TimerHandle | None = None

    @property
    def pending(self) -> int:
        """Events counted and not yet logged."""
        return self._count

    def add(self, message: str, *args: object) -> None:
        """Count one event: ``message % args`` goes to INFO if it opens a burst, else DEBUG."""
        self._log.log(logging.DEBUG if self._count else logging.INFO, message, *args)
        if self._count == 0:
            self._since = self._clock()
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                loop = None
            if loop is not None:
                self._timer = loop.call_later(self._window_s, self.flush)
        self._count += 1

    def flush(self) -> None:
        """End the burst: one line counting its events after the first (none if it had one)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._count > 1:
            seconds = self._clock() - self._since
            self._log.info(self._summary.format(count=self._count - 1, seconds=seconds))
        self._count = 0
