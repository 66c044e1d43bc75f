"""A real webhook receiver under uvicorn, and the whole pipeline with the dispatcher."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from ipaddress import ip_network
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI, Request, Response
from standardwebhooks import Webhook, WebhookVerificationError

from plumbing.settings import Settings
from producers.service import run_relay
from tests.integration.pipeline import DOC, Pipeline, open_pipeline
from tests.integration.serving import until
from tests.support.topics import read_until
from workers.service import run_worker
from workers.webhooks.process import run_webhooks

LOOPBACK = (ip_network("127.0.0.0/8"), ip_network("::1/128"))


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float  # time.monotonic() on arrival
    verified_by: list[int]  # indexes of the receiver's secrets whose verify() passed
    payload: dict[str, Any] | None

    @property
    def id(self) -> str:
        return self.headers["webhook-id"]


Reply = Callable[[Received], Response | Awaitable[Response]]


@dataclass
class Receiver:
    """Records every request, verifies each with ``Webhook(secret).verify`` for every
    secret it knows, and answers by path (default 204)."""

    secrets: list[str] = field(default_factory=list)
    replies: dict[str, Reply] = field(default_factory=dict)
    got: list[Received] = field(default_factory=list)
    in_flight: int = 0
    most_in_flight: int = 0
    port: int = 0
    host: str = "127.0.0.1"
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    def url(self, path: str, host: str | None = None) -> str:
        host = host or self.host
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{self.port}{path}"

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.post("/{path:path}")
        async def receive(path: str, request: Request) -> Response:
            body = await request.body()
            headers = dict(request.headers)
            verified, payload = [], None
            for i, secret in enumerate(self.secrets):
                with contextlib.suppress(WebhookVerificationError):
                    payload = Webhook(secret).verify(body, headers)
                    verified.append(i)
            got = Received(
                path=f"/{path}",
                headers=headers,
                body=body,
                at=time.monotonic(),
                verified_by=verified,
                payload=payload,
            )
            self.got.append(got)
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            self._changed.set()
            try:
                reply = self.replies.get(got.path)
                answer = reply(got) if reply else Response(status_code=204)
                return await answer if inspect.isawaitable(answer) else answer
            finally:
                self.in_flight -= 1
                self._changed.set()

        return app

    def on(self, path: str) -> list[Received]:
        return [r for r in self.got if r.path == path]

    async def wait(self, check: Callable[[], bool], within_s: float = 60) -> None:
        async with asyncio.timeout(within_s):
            while not check():
                self._changed.clear()
                await self._changed.wait()


@contextlib.asynccontextmanager
async def receiving(
    receiver: Receiver, host: str = "127.0.0.1", sock: socket.socket | None = None
) -> AsyncIterator[Receiver]:
    """The receiver under uvicorn on a free port of ``host``, or listening on ``sock`` (a
    socket bound beforehand, see ``reserved_port``)."""
    config = uvicorn.Config(
        receiver.app(), host=host, port=0, lifespan="off", log_config=None, access_log=False
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock] if sock else None))
    try:
        await until(lambda: server.started or task.done(), within_s=10)
        assert server.started, "uvicorn did not start"
        receiver.host = host
        receiver.port = server.servers[0].sockets[0].getsockname()[1]
        yield receiver
    finally:
        server.should_exit = True
        await task


@contextlib.contextmanager
def reserved_port(receiver: Receiver, host: str = "127.0.0.1") -> Iterator[socket.socket]:
    """A socket bound to a free port of ``host`` that does not listen: a connection to it
    is refused (a receiver that is down) until ``receiving(receiver, host, sock)`` serves
    on it. ``receiver.url`` points there from now on."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        receiver.host = host
        receiver.port = sock.getsockname()[1]
        yield sock


def webhook_settings(settings: Settings, **overrides: Any) -> Settings:
    """Fast jobs, a dispatcher group of the test's own, a quick join on Tansu, a short
    retry schedule, loopback allowed (the receiver is there) unless overridden."""
    return settings.model_copy(
        update={
            "sim_time_scale": 0.1,
            "webhook_group": f"{settings.consumer_group}-webhooks",
            "webhook_session_timeout_s": 6.0,
            "webhook_retry_schedule_s": (0.0, 0.2, 0.2),
            "webhook_allow_networks": LOOPBACK,
            **overrides,
        }
    )


def start_roles(pipeline: Pipeline) -> None:
    """The relay, one worker and the webhook dispatcher."""
    pipeline.start(run_relay)
    pipeline.start(run_worker)
    pipeline.start(run_webhooks)


@contextlib.asynccontextmanager
async def webhook_pipeline(settings: Settings, *, start: bool = True) -> AsyncIterator[Pipeline]:
    """The API, and with ``start`` the other roles (else ``start_roles`` later)."""
    async for pipeline in open_pipeline(settings):
        if start:
            start_roles(pipeline)
        yield pipeline


# The API: a pipeline's client, or a client of the API served alone (tests/faults).
API = Pipeline | httpx.AsyncClient


def _client(api: API) -> httpx.AsyncClient:
    return api.client if isinstance(api, Pipeline) else api


async def create_secret(api: API, tenant: str | None = None) -> dict[str, Any]:
    headers = {"X-Sluicegate-Tenant": tenant} if tenant else {}
    r = await _client(api).post("/v1/webhooks/secrets", headers=headers)
    assert r.status_code == 201, r.text
    body: dict[str, Any] = r.json()
    return body


async def submit(api: API, callback_url: str | None, **extra: Any) -> str:
    body: dict[str, Any] = {"kind": "summarize", "input": DOC, **extra}
    if callback_url is not None:
        body["callback_url"] = callback_url
    r = await _client(api).post("/v1/jobs", json=body)
    assert r.status_code == 202, r.text
    job_id: str = r.json()["id"]
    return job_id


async def delivery_of(api: API, subject: str, state: str, within_s: float = 60) -> dict[str, Any]:
    """The subject's one delivery, with its attempts, once it has finished (delivered or
    dead); it must have finished in ``state``."""
    client = _client(api)
    async with asyncio.timeout(within_s):
        while True:
            r = await client.get("/v1/webhooks/deliveries", params={"subject": subject})
            assert r.status_code == 200, r.text
            found = r.json()["data"]
            assert len(found) <= 1, found
            if found and found[0]["state"] != "pending":
                assert found[0]["state"] == state, found[0]
                detail = await client.get(f"/v1/webhooks/deliveries/{found[0]['id']}")
                assert detail.status_code == 200, detail.text
                view: dict[str, Any] = detail.json()
                return view
            await asyncio.sleep(0.1)


async def dead_letter_records(settings: Settings, key: str, within_s: float = 30) -> list[Any]:
    """The records on the dead-letter topic keyed ``key`` (waits for the first)."""
    found = await read_until(
        settings.require_kafka(),
        settings.dead_letter_topic,
        lambda read: any(m.key == key.encode() for m in read),
        within_s=within_s,
    )
    return [m for m in found if m.key == key.encode()]


def failing(receiver: Receiver, times: int, status: int, **headers: str) -> Reply:
    """A reply: ``status`` (with ``headers``) to the first ``times`` requests of each
    delivery, then 204."""

    def reply(got: Received) -> Response:
        # The receiver records a request before it answers: this one is already counted.
        if sum(r.id == got.id for r in receiver.got) <= times:
            return Response(status_code=status, headers=headers)
        return Response(status_code=204)

    return reply
