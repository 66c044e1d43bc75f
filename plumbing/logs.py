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
    """One INFO line for a burst of the same event, with its count, instead of one a time.

    ``add`` logs the event itself at DEBUG and counts it; ``window_s`` after the first event
    of a burst (or at ``flush``) one INFO line says how many there were. A batch cancel that
    fences off hundreds of attempts is one line.
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
        self._summary = summary  # formatted with count= and seconds=
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
        """Count one event; ``message % args`` goes to DEBUG."""
        self._log.debug(message, *args)
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
        """Log the events counted so far in one line (nothing when there were none)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._count == 0:
            return
        seconds = self._clock() - self._since
        self._log.info(self._summary.format(count=self._count, seconds=seconds))
        self._count = 0
