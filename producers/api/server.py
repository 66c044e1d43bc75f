"""The API's uvicorn server, in one process or several on one socket.

uvicorn's own shutdown closes every WebSocket at once (1012), its answers unsent: a submit
channel's frames would be stored and never answered. ``ApiServer`` first stops taking
connections and lets each channel answer the frames it read and close with 1001
(``producers.api.channel``), then shuts down as uvicorn does: in-flight requests answered,
the rest cut after ``timeout_graceful_shutdown``.

Several processes (``serve_processes``) each run an ``ApiServer`` on the one socket bound
here. A process that exits on its own stops the others, and the command exits 1 for its
supervisor (systemd, Kubernetes, Compose) to restart it: a half-served API is not kept.
"""

from __future__ import annotations

import logging
import multiprocessing
import signal
import socket
from multiprocessing.connection import wait
from types import FrameType

import uvicorn

from producers.api import channel

log = logging.getLogger(__name__)


# What uvicorn's websockets-sansio protocol logs at ERROR when an app returns after refusing
# a handshake with an HTTP answer (the ``websocket.http.response`` extension), an answer it
# did send: it never marks that handshake complete (uvicorn pull request 3138; its wsproto
# protocol does, and is slower here).
HANDSHAKE_ERROR = "ASGI callable returned without completing handshake."


class DenialsSent(logging.Filter):
    """Drops uvicorn's ERROR line after each refused submit channel handshake (a wrong key is
    a caller's mistake, answered 401, not the server's error); the same line for anything
    else stays."""

    def filter(self, record: logging.LogRecord) -> bool:
        if channel.OPEN.denied and record.getMessage() == HANDSHAKE_ERROR:
            channel.OPEN.denied -= 1
            return False
        return True


_DENIALS = DenialsSent()


class ApiServer(uvicorn.Server):
    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        logging.getLogger("uvicorn.error").addFilter(_DENIALS)  # once: the same filter
        await super().serve(sockets)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for server in self.servers:
            server.close()  # no new connections while the channels drain
        try:
            await channel.OPEN.drain_all(self.config.timeout_graceful_shutdown or 30.0)
        except TimeoutError:
            log.warning("submit channels still answering at the shutdown timeout")
        await super().shutdown(sockets)


def _serve(config: uvicorn.Config, sock: socket.socket) -> None:
    # After its drain uvicorn gives the signal back to the handler it found: the default one
    # would end the drained process with -15, which reads as a crash.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, exit_cleanly)
    config.configure_logging()
    ApiServer(config).run(sockets=[sock])


def exit_cleanly(signum: int, frame: FrameType | None) -> None:
    """A signal handler for a drained server: the process exits 0."""
    raise SystemExit(0)


def serve_processes(config: uvicorn.Config, processes: int) -> int:
    """``processes`` servers on one socket until SIGTERM or SIGINT (each drained), or until
    one exits by itself (the others stopped): the exit status for the command."""
    sock = config.bind_socket()
    spawn = multiprocessing.get_context("spawn")
    children = [
        spawn.Process(target=_serve, args=(config, sock), name=f"api-{n}") for n in range(processes)
    ]
    stopping: list[int] = []

    def stop(signum: int, frame: FrameType | None) -> None:
        stopping.append(signum)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        for child in children:
            child.start()
        while not stopping and all(child.is_alive() for child in children):
            wait([child.sentinel for child in children], timeout=0.5)
        if not stopping:
            log.error("an API process exited by itself; stopping the others")
        for child in children:
            if child.is_alive() and child.pid is not None:
                child.terminate()  # SIGTERM: each drains as a lone server does
        for child in children:
            child.join()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        sock.close()
    return 0 if stopping and all(child.exitcode == 0 for child in children) else 1
