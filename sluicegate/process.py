"""Process plumbing: logging, signals, and the stop event every loop watches."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable

from plumbing import logs
from plumbing.settings import Settings


def configure_logging(settings: Settings, role: str) -> None:
    """Log at ``log_level``, each line naming this process: ``process_name`` when the
    stack gave it one (``worker-1``), else ``role``."""
    logs.configure(settings.log_level, settings.process_name or role)


def run_until_signal(main: Callable[[asyncio.Event], Awaitable[None]]) -> None:
    """Run ``main(stop)``; SIGTERM or SIGINT sets ``stop`` so it can drain and return."""

    async def runner() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await main(stop)

    asyncio.run(runner())
