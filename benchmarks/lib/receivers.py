"""Webhook receivers in the benchmark's own process: plain HTTP servers on a free port that
answer every delivery and remember what came (``Receiver``: 204, always; ``FailingReceiver``:
500 to every delivery about a stable share of the subjects, 204 to the others)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
from collections import defaultdict
from dataclasses import dataclass, field

from sluicegate.local.embedded import free_port


@dataclass
class Receiver:
    """A plain HTTP server that answers 204 to every webhook and remembers what came."""

    port: int = field(default_factory=free_port)
    ids_by_job: defaultdict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    attempts: int = 0

    async def serve(self) -> asyncio.Server:
        return await asyncio.start_server(self._connection, "127.0.0.1", self.port)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError, ValueError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                headers = {}
                for line in head.decode("latin-1").split("\r\n")[1:]:
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                self.attempts += 1
                job = json.loads(body).get("data", {}).get("id", "?")
                self.ids_by_job[job].add(headers.get("webhook-id", "?"))
                writer.write(b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n")
                await writer.drain()
        writer.close()


def failing(subject: str, share: float) -> bool:
    """Whether the receiver refuses every delivery about ``subject`` (a stable pick)."""
    digest = hashlib.sha256(subject.encode()).digest()
    return int.from_bytes(digest[:4], "big") < share * 2**32


@dataclass
class FailingReceiver:
    """An HTTP server for webhooks: 204, or 500 for the subjects ``failing`` picks."""

    fail_share: float
    port: int = field(default_factory=free_port)
    subjects: set[str] = field(default_factory=set)
    attempts: int = 0
    refused: int = 0

    async def serve(self) -> asyncio.Server:
        return await asyncio.start_server(self._connection, "127.0.0.1", self.port)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError, ValueError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.decode("latin-1").split("\r\n")[1:]:
                    name, _, value = line.partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value.strip())
                body = await reader.readexactly(length)
                self.attempts += 1
                subject = str(json.loads(body).get("data", {}).get("id", "?"))
                self.subjects.add(subject)
                if failing(subject, self.fail_share):
                    self.refused += 1
                    writer.write(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n")
                else:
                    writer.write(b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n")
                await writer.drain()
        writer.close()
