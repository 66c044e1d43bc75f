"""One PostgreSQL LISTEN connection that stays up.

Notifications sent while the connection was down are lost, so every (re)connect is reported
to ``on_connect``: the listener's owner re-reads what it waits on instead of trusting that it
heard everything.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import asyncpg

from plumbing.db import libpq_url
from plumbing.retry import Stopped, retrying, wait_first

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class JobNotice:
    """A job entered a terminal state (the jobs trigger's payload)."""

    job_id: str
    state: str
    at: float  # epoch seconds of the write, by the database's clock
    reason: str  # the error's reason or code (cancelled, disconnected, ...), else the state
    in_batch: bool | None = None  # one of a batch's jobs (None: the notice does not say)

    @classmethod
    def parse(cls, payload: str) -> JobNotice | None:
        parts = payload.split(" ")
        if len(parts) not in (3, 4, 5):
            return None
        try:
            at = float(parts[2])
        except ValueError:
            return None
        reason = parts[3] if len(parts) >= 4 else parts[1]
        in_batch = parts[4] == "batch" if len(parts) == 5 else None
        return cls(job_id=parts[0], state=parts[1], at=at, reason=reason, in_batch=in_batch)


class Listener:
    def __init__(
        self,
        url: str,
        channel: str,
        *,
        on_notice: Callable[[str], None],
        on_connect: Callable[[], None] | None = None,
        also: Mapping[str, Callable[[str], None]] | None = None,
    ) -> None:
        """``also``: further channels on the same connection, each with its handler."""
        self._url = libpq_url(url)
        self._channel = channel
        self._on_notice = on_notice
        self._on_connect = on_connect
        self._also = dict(also or {})
        self.connected = asyncio.Event()

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            lost = asyncio.Event()
            try:
                conn = await retrying(
                    f"listen_{self._channel}",
                    lambda: asyncpg.connect(self._url, timeout=5),
                    stop=stop,
                    transient=_unreachable,
                )
            except Stopped:
                return
            try:
                conn.add_termination_listener(lambda _, lost=lost: lost.set())
                for channel, handler in self._also.items():
                    await conn.add_listener(channel, _handler(handler))
                await conn.add_listener(self._channel, self._notified)  # its own last
                self.connected.set()
                if self._on_connect is not None:
                    self._on_connect()
                await wait_first(stop, lost)
            except (OSError, asyncpg.PostgresError) as exc:
                log.warning("LISTEN %s lost: %r", self._channel, exc)
            finally:
                self.connected.clear()
                with contextlib.suppress(Exception):
                    await conn.close(timeout=2)

    def _notified(self, _conn: object, _pid: int, _channel: str, payload: object) -> None:
        self._on_notice(str(payload))


def _handler(on_notice: Callable[[str], None]) -> Callable[[object, int, str, object], None]:
    def notified(_conn: object, _pid: int, _channel: str, payload: object) -> None:
        on_notice(str(payload))

    return notified


def _unreachable(exc: BaseException) -> str | None:
    """The database could not be reached or refused the connection."""
    return "connection" if isinstance(exc, OSError | asyncpg.PostgresError | TimeoutError) else None
