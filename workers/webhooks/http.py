"""One webhook POST, safe against SSRF.

The host is resolved here and every address it resolves to is checked against the
address policy; the request then goes to the first address itself (the URL's host is
replaced by it), with the original ``Host`` header and, over TLS, the original name as SNI
and as the name the certificate is checked against. So the address that was checked is
the address that is called: a second resolution cannot point it elsewhere (DNS
rebinding). Redirects are never followed, proxies from the environment are ignored, and
no connection is kept alive (a pooled connection is keyed by address, and one made for
one name must not carry another's request).
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Awaitable, Callable, Mapping
from ipaddress import ip_address

import httpx

from workers.webhooks.retry import AttemptResult, parse_retry_after
from workers.webhooks.ssrf import AddressPolicy

# host, port -> the addresses it resolves to
Resolve = Callable[[str, int], Awaitable[list[str]]]

USER_AGENT = "Sluicegate-Webhooks/1"


async def system_resolve(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def _answer(
    started: float,
    status: int | None = None,
    *,
    error: str | None = None,
    retry_after_s: float | None = None,
    refused: bool = False,
) -> AttemptResult:
    return AttemptResult(
        status=status,
        error=error[:500] if error else None,
        retry_after_s=retry_after_s,
        refused=refused,
        duration_ms=(time.monotonic() - started) * 1000,
    )


def _is_ip(host: str) -> bool:
    try:
        ip_address(host)
    except ValueError:
        return False
    return True


class WebhookClient:
    def __init__(
        self,
        *,
        policy: AddressPolicy,
        timeout_s: float,
        resolve: Resolve = system_resolve,
        transport: httpx.AsyncBaseTransport | None = None,  # tests: httpx.MockTransport
    ) -> None:
        self._policy = policy
        self._timeout_s = timeout_s
        self._resolve = resolve
        self._http = httpx.AsyncClient(
            timeout=timeout_s,
            follow_redirects=False,
            trust_env=False,
            limits=httpx.Limits(max_keepalive_connections=0),
            transport=transport,
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def post(self, url: str, body: bytes, headers: Mapping[str, str]) -> AttemptResult:
        """POST ``body`` to ``url``; never raises for what the network or the receiver did."""
        started = time.monotonic()
        try:
            target = httpx.URL(url)
        except httpx.InvalidURL as exc:
            return _answer(started, error=f"invalid URL: {exc}", refused=True)
        if target.scheme not in ("http", "https") or not target.host:
            return _answer(started, error="not an absolute http(s) URL", refused=True)
        port = target.port or (443 if target.scheme == "https" else 80)
        try:
            async with asyncio.timeout(self._timeout_s):
                try:
                    addresses = await self._resolve(target.host, port)
                except OSError as exc:
                    return _answer(started, error=f"cannot resolve {target.host}: {exc}")
                if not addresses:
                    return _answer(started, error=f"{target.host} resolves to no address")
                for address in addresses:
                    if (why := self._policy.refusal(address)) is not None:
                        refusal = f"refused by the SSRF policy: {why} ({target.host})"
                        return _answer(started, error=refusal, refused=True)
                return await self._send(target, addresses[0], body, headers, started)
        except TimeoutError:
            return _answer(started, error=f"timed out after {self._timeout_s:g} s")

    async def _send(
        self,
        target: httpx.URL,
        address: str,
        body: bytes,
        headers: Mapping[str, str],
        started: float,
    ) -> AttemptResult:
        pinned = target.copy_with(host=address.split("%", 1)[0])
        extensions = {}
        if target.scheme == "https" and not _is_ip(target.host):
            extensions["sni_hostname"] = target.host
        request_headers = {
            "Host": target.netloc.decode("ascii"),
            "Content-Type": "application/json",
            "User-Agent": USER_AGENT,
            **headers,
        }
        try:
            async with self._http.stream(
                "POST", pinned, content=body, headers=request_headers, extensions=extensions
            ) as response:
                status = response.status_code
                retry_after = parse_retry_after(response.headers.get("Retry-After"))
                location = response.headers.get("Location")
        except httpx.TimeoutException:
            return _answer(started, error=f"timed out after {self._timeout_s:g} s")
        except httpx.HTTPError as exc:
            return _answer(started, error=f"{type(exc).__name__}: {exc}")
        if 300 <= status < 400:
            return _answer(started, status, error=f"redirect refused (Location: {location})")
        if 200 <= status < 300:
            return _answer(started, status)
        return _answer(started, status, error=f"HTTP {status}", retry_after_s=retry_after)
