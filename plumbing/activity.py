"""Whether anything happened in the database that a process's quiet loops watch.

A process's LISTEN connection (``plumbing.notify.Listener``) touches its ``Activity`` at
every notice (a row written to the outbox, a job that ended) and at every (re)connect:
notices sent while it was down are lost, so a reconnect counts as activity too. A loop
that found nothing to do may then wait long (``QUIET_S``) instead of its interval, woken
at once by the next touch; and a reader may reuse what it read while nothing was touched
since. Only while the listener is connected: without it, nothing is known to be quiet.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

# How long a loop that found nothing to do waits, with nothing heard, before it looks
# again anyway (what a crashed process left behind, what changed with time alone).
QUIET_S = 30.0


class Activity:
    def __init__(self) -> None:
        self._version = 0
        self._changed = asyncio.Event()
        self._listening: Callable[[], bool] = lambda: False

    def heard_by(self, connected: asyncio.Event) -> None:
        """``connected``: set while the listener that touches this is connected."""
        self._listening = connected.is_set

    def touch(self) -> None:
        """Something happened (or may have: the listener reconnected)."""
        self._version += 1
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    @property
    def version(self) -> int:
        """Grows at every touch: unchanged, and ``listening``, means nothing was heard."""
        return self._version

    @property
    def listening(self) -> bool:
        return self._listening()

    def changed(self) -> asyncio.Event:
        """The event the next touch sets (take it before the work it should interrupt)."""
        return self._changed

    def quiet_since(self, version: int) -> bool:
        """Whether nothing can have happened since ``version`` was read."""
        return self.listening and self._version == version
