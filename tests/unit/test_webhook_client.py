"""The SSRF-safe POST: the resolved address is checked, then called itself (Host and SNI
kept), redirects are not followed. httpx's MockTransport stands in for the network, so a
request that the policy failed to stop is recorded here instead of leaving the machine."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from ipaddress import ip_network

import httpx
import pytest

from workers.webhooks.http import WebhookClient
from workers.webhooks.ssrf import AddressPolicy

DNS = {
    "hooks.example.com": ["93.184.215.14"],
    "internal.example.com": ["10.1.2.3"],
    "metadata.example.com": ["169.254.169.254"],
    "split.example.com": ["93.184.215.14", "192.168.0.7"],  # one bad address is enough
}


async def fake_resolve(host: str, port: int) -> list[str]:
    if host in DNS:
        return DNS[host]
    return [host]  # an IP literal resolves to itself


def client(
    reply: Callable[[httpx.Request], httpx.Response] | None = None,
    *,
    seen: list[httpx.Request],
    allow: tuple[str, ...] = (),
) -> WebhookClient:
    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return reply(request) if reply else httpx.Response(204)

    return WebhookClient(
        policy=AddressPolicy(allow=tuple(ip_network(n) for n in allow)),
        timeout_s=5,
        resolve=fake_resolve,
        transport=httpx.MockTransport(handler),
    )


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://10.0.0.1/hook", "private"),
        ("http://10.200.3.4:8080/hook", "private"),
        ("http://169.254.169.254/latest/meta-data/", "metadata"),
        ("http://[fd00:ec2::254]/latest/meta-data/", "metadata"),
        ("http://127.0.0.1:9000/hook", "loopback"),
        ("http://[::1]:9000/hook", "loopback"),
        ("https://internal.example.com/hook", "private"),
        ("https://metadata.example.com/hook", "metadata"),
        ("https://split.example.com/hook", "private"),
        ("http://0.0.0.0/hook", "unspecified"),
    ],
)
async def test_refused_destinations_are_never_called(url: str, why: str) -> None:
    seen: list[httpx.Request] = []
    webhooks = client(seen=seen)
    answer = await webhooks.post(url, b"{}", {})
    await webhooks.aclose()
    assert answer.refused
    assert answer.status is None
    assert answer.error is not None
    assert "refused by the SSRF policy" in answer.error
    assert why in answer.error
    assert seen == []


async def test_the_checked_address_is_called_with_the_name_kept() -> None:
    seen: list[httpx.Request] = []
    webhooks = client(seen=seen)
    answer = await webhooks.post(
        "https://hooks.example.com:8443/in?x=1", b'{"a":1}', {"webhook-id": "msg_1"}
    )
    await webhooks.aclose()
    assert answer.status == 204
    assert not answer.refused
    (request,) = seen
    assert request.url.host == "93.184.215.14"  # pinned: no second resolution
    assert request.url.port == 8443
    assert request.url.raw_path == b"/in?x=1"
    assert request.headers["host"] == "hooks.example.com:8443"
    assert request.extensions["sni_hostname"] == "hooks.example.com"
    assert request.headers["webhook-id"] == "msg_1"
    assert request.headers["content-type"] == "application/json"
    assert request.content == b'{"a":1}'


async def test_an_allow_listed_network_is_called() -> None:
    seen: list[httpx.Request] = []
    webhooks = client(seen=seen, allow=("10.1.0.0/16",))
    answer = await webhooks.post("http://internal.example.com/hook", b"{}", {})
    await webhooks.aclose()
    assert answer.status == 204
    assert seen[0].url.host == "10.1.2.3"
    assert "sni_hostname" not in seen[0].extensions  # plain http


async def test_a_redirect_is_a_failed_attempt_and_not_followed() -> None:
    seen: list[httpx.Request] = []
    moved = httpx.Response(307, headers={"Location": "http://hooks.example.com/elsewhere"})
    webhooks = client(lambda _: moved, seen=seen)
    answer = await webhooks.post("http://hooks.example.com/hook", b"{}", {})
    await webhooks.aclose()
    assert answer.status == 307
    assert answer.error is not None
    assert "redirect refused" in answer.error
    assert len(seen) == 1


async def test_retry_after_is_read() -> None:
    seen: list[httpx.Request] = []
    busy = httpx.Response(429, headers={"Retry-After": "30"})
    webhooks = client(lambda _: busy, seen=seen)
    answer = await webhooks.post("http://hooks.example.com/hook", b"{}", {})
    await webhooks.aclose()
    assert (answer.status, answer.retry_after_s) == (429, 30.0)


@pytest.mark.parametrize("url", ["ftp://hooks.example.com/x", "/relative", "http://"])
async def test_not_an_http_url_is_refused(url: str) -> None:
    seen: list[httpx.Request] = []
    webhooks = client(seen=seen)
    answer = await webhooks.post(url, b"{}", {})
    await webhooks.aclose()
    assert answer.refused
    assert seen == []


async def test_an_attempt_is_bounded_by_the_timeout() -> None:
    async def slow_resolve(host: str, port: int) -> list[str]:
        await asyncio.sleep(10)
        return ["93.184.215.14"]

    webhooks = WebhookClient(
        policy=AddressPolicy(),
        timeout_s=0.05,
        resolve=slow_resolve,
        transport=httpx.MockTransport(lambda _: httpx.Response(204)),
    )
    answer = await webhooks.post("http://hooks.example.com/hook", b"{}", {})
    await webhooks.aclose()
    assert answer.status is None
    assert answer.error is not None
    assert "timed out" in answer.error
