"""The client for threads: ``Client`` here is ``client.api.AsyncClient`` with
every method blocking, for programs that are not asyncio (as Celery's callers are not).

It runs the async client on an event loop of its own, in a thread of its own, so submits
made at once from many threads are coalesced into bulk requests as the async client's
concurrent submits are (``client.coalesce``); each thread gets its own answer, refusal or
error. A call interrupted (Ctrl-C in the main thread) is cancelled in the loop too.

    from client.sync import Client

    with Client("http://127.0.0.1:8000", api_key=KEY) as client:
        accepted = client.submit(JobKind.SUMMARIZE, text, ttl_s=3600)
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from types import TracebackType
from typing import Any, Concatenate, ParamSpec, TypeVar

from client import api

P = ParamSpec("P")
R = TypeVar("R")


def _blocking(
    method: Callable[Concatenate[api.AsyncClient, P], Coroutine[Any, Any, R]],
) -> Callable[Concatenate[Client, P], R]:
    """``method`` of the async client, called from any thread and waited for."""

    def call(self: Client, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.run(method(self.aio, *args, **kwargs))

    call.__name__ = method.__name__
    call.__doc__ = method.__doc__
    return call


class Client:
    def __init__(self, base_url: str, **options: Any) -> None:
        """``options``: those of ``client.api.AsyncClient`` (``tenant``, ``api_key``,
        ``timeout_s``, ``retry``, ``coalesce``…)."""
        self._loop = _new_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="sluicegate-client", daemon=True
        )
        self._thread.start()
        self.aio = self.run(_made(base_url, options))  # the async client it runs
        self.base_url = base_url

    def run(self, call: Coroutine[Any, Any, R]) -> R:
        """Run ``call`` on the client's loop and wait for it (cancelled if interrupted)."""
        future = asyncio.run_coroutine_threadsafe(call, self._loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()
            raise

    def close(self) -> None:
        if self._loop.is_closed():
            return
        try:
            self.run(self.aio.close())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    submit = _blocking(api.AsyncClient.submit)
    create_batch = _blocking(api.AsyncClient.create_batch)
    get_batch = _blocking(api.AsyncClient.get_batch)
    batch_results = _blocking(api.AsyncClient.batch_results)
    get = _blocking(api.AsyncClient.get)
    cancel = _blocking(api.AsyncClient.cancel)
    list_jobs = _blocking(api.AsyncClient.list_jobs)
    list_batches = _blocking(api.AsyncClient.list_batches)
    timeline = _blocking(api.AsyncClient.timeline)
    overview = _blocking(api.AsyncClient.overview)
    redeliver = _blocking(api.AsyncClient.redeliver)


async def _made(base_url: str, options: dict[str, Any]) -> api.AsyncClient:
    """The async client, made on the loop that will run it."""
    return api.AsyncClient(base_url, **options)


def _new_loop() -> asyncio.AbstractEventLoop:
    """uvloop's where it is installed (it is a dependency off Windows): the loop is the
    client's own, and a caller's plain loop of submits spends less of its time in it."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()
