"""Load offered over HTTP to an API running as a process: Poisson single submits, each one
submit and never retried (``offer``, with a callback; ``offer_plain``, without), and
batches of lines at a steady pace (``offer_batches``); every answer is kept."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from benchmarks.lib.trace import Mix, backlog

MAX_IN_FLIGHT = 512  # submits waiting for their answer; arrivals past it are not sent


@dataclass
class Answer:
    sent_s: float
    latency_s: float
    status: int
    reason: str | None = None
    job_id: str | None = None


@dataclass
class Load:
    answers: list[Answer] = field(default_factory=list)
    accepted: dict[str, float] = field(default_factory=dict)  # job id: when submitted
    not_sent: int = 0
    in_flight: int = 0


async def submit(
    client: httpx.AsyncClient, load: Load, body: dict[str, Any], started: float
) -> None:
    sent = time.monotonic()
    load.in_flight += 1
    try:
        r = await client.post("/v1/jobs", json=body)
    except httpx.HTTPError as exc:
        load.answers.append(Answer(sent - started, time.monotonic() - sent, 0, type(exc).__name__))
        return
    finally:
        load.in_flight -= 1
    answer = Answer(sent - started, time.monotonic() - sent, r.status_code)
    if r.status_code == 202:
        answer.job_id = r.json()["id"]
        load.accepted[answer.job_id] = sent
    else:
        with contextlib.suppress(ValueError):
            payload = r.json()
            answer.reason = payload.get("reason") or payload.get("error", {}).get("code")
    load.answers.append(answer)


async def offer(
    client: httpx.AsyncClient, load: Load, rate: float, seconds: float, callback: str
) -> None:
    """Poisson arrivals at ``rate`` for ``seconds``, each one submit (not retried)."""
    rng = random.Random(11)
    docs = backlog(400, Mix(), seed=13)
    tasks: set[asyncio.Task[None]] = set()
    started = time.monotonic()
    at = rng.expovariate(rate)
    index = 0
    while at < seconds:
        await asyncio.sleep(max(0.0, started + at - time.monotonic()))
        if load.in_flight >= MAX_IN_FLIGHT:
            load.not_sent += 1
        else:
            doc, max_tokens = docs[index % len(docs)]
            body = {
                "kind": "summarize",
                "input": doc,
                "max_tokens": max_tokens,
                "ttl_s": 3600,
                "callback_url": callback,
            }
            task = asyncio.create_task(submit(client, load, body, started))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        index += 1
        at += rng.expovariate(rate)
    await asyncio.gather(*tasks)


@dataclass
class Batches:
    accepted: dict[str, int] = field(default_factory=dict)  # batch id: its jobs
    refused: Counter[str] = field(default_factory=Counter)


async def offer_batches(
    client: httpx.AsyncClient,
    batches: Batches,
    doc: Callable[[int], tuple[str, int]],
    *,
    every_s: float,
    size: int,
    seconds: float,
    window: str = "1h",
    callback: str | None = None,
) -> None:
    """A batch of ``size`` lines every ``every_s`` for ``seconds``, the first at once; the
    k-th line offered summarizes ``doc(k)`` (a document and its max_tokens)."""
    started, n = time.monotonic(), 0
    while (at := n * every_s) < seconds:
        await asyncio.sleep(max(0.0, started + at - time.monotonic()))
        lines = []
        for i in range(size):
            text, max_tokens = doc(n * size + i)
            body = {"kind": "summarize", "input": text, "max_tokens": max_tokens}
            lines.append(
                {"custom_id": f"{n}-{i}", "method": "POST", "url": "/v1/jobs", "body": body}
            )
        request: dict[str, Any] = {"requests": lines, "completion_window": window}
        if callback is not None:
            request["callback_url"] = callback
        try:
            r = await client.post("/v1/batches", json=request)
        except httpx.HTTPError as exc:
            batches.refused[type(exc).__name__] += 1
        else:
            if r.status_code == 201:
                batches.accepted[r.json()["id"]] = size
            else:
                reason = None
                with contextlib.suppress(ValueError, AttributeError):
                    payload = r.json()
                    reason = payload.get("reason") or payload.get("error", {}).get("code")
                batches.refused[f"{r.status_code} {reason}"] += 1
        n += 1


async def offer_plain(client: httpx.AsyncClient, load: Load, rate: float, seconds: float) -> None:
    """``offer``'s arrivals and documents without a callback (nor its cap on submits in
    flight)."""
    rng = random.Random(11)
    docs = backlog(400, Mix(), seed=13)
    tasks: set[asyncio.Task[None]] = set()
    started = time.monotonic()
    at, index = rng.expovariate(rate), 0
    while at < seconds:
        await asyncio.sleep(max(0.0, started + at - time.monotonic()))
        doc, max_tokens = docs[index % len(docs)]
        body = {"kind": "summarize", "input": doc, "max_tokens": max_tokens, "ttl_s": 3600}
        task = asyncio.create_task(submit(client, load, body, started))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        index += 1
        at += rng.expovariate(rate)
    await asyncio.gather(*tasks)
