"""``sluicegate status`` (``--watch``), ``jobs``, ``jobs show``, ``batches`` and ``webhooks
redeliver``: the read side of a running stack through its API (``client.api``). A common
mistake (no stack, a wrong key, an unknown id) is one line and an exit code, never a
traceback: 2 bad flags, 4 refused by the API, 5 the API cannot be reached, 130 interrupted."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

from rich.console import Console, RenderableType
from rich.live import Live
from rich.text import Text

from client.api import ApiError, AsyncClient, Unreachable
from plumbing.retry import wait_first
from plumbing.settings import Settings
from schemas.batches import InvalidCompletionWindow, window_seconds
from sluicegate.commands import views
from sluicegate.commands.client import (
    INPUT,
    INTERRUPTED,
    REFUSED,
    UNREACHABLE,
    api_url_of,
    key_source,
)
from sluicegate.local import key as local_key
from sluicegate.process import run_until_signal

Action = Callable[[AsyncClient, asyncio.Event], Awaitable[int]]
TIMEOUT_S = 10.0
T = TypeVar("T")


def run(settings: Settings, args: argparse.Namespace) -> int:
    out = Console(width=None if sys.stdout.isatty() else 200, soft_wrap=False)
    err = Console(stderr=True, soft_wrap=True, highlight=False)
    api_url = api_url_of(settings, args.api)
    if args.command == "status":
        try:
            window_s = int(window_seconds(args.window))
        except InvalidCompletionWindow:
            err.print(f"--window: {args.window!r} is not a duration such as 5m, 1h or 90s")
            return INPUT
        if args.interval <= 0:
            err.print("--interval: must be over 0 s")
            return INPUT
        action = _status(out, api_url, window_s, args.interval if args.watch else None)
    elif args.command == "jobs":
        action = _show(out, args.job_id) if args.jobs_command == "show" else _jobs(out, args)
    elif args.command == "batches":
        action = _batches(out, args)
    else:
        action = _redeliver(out, args.delivery_id)
    if getattr(args, "limit", 1) < 1:
        err.print("--limit: must be 1 or more")
        return INPUT
    code: list[int] = []
    key = local_key.read_key(settings)
    run_until_signal(lambda stop: _guarded(action, stop, api_url, key, settings, err, code))
    return code[0] if code else INTERRUPTED


async def _guarded(
    action: Action,
    stop: asyncio.Event,
    api_url: str,
    key: str | None,
    settings: Settings,
    err: Console,
    code: list[int],
) -> None:
    """Run ``action`` until it ends or a signal comes (then quietly: 130)."""
    async with AsyncClient(api_url, api_key=key, timeout_s=TIMEOUT_S) as client:
        run = asyncio.ensure_future(action(client, stop))
        stopped = asyncio.ensure_future(stop.wait())
        await asyncio.wait([run, stopped], return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        if not run.done():
            run.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await run
            return
        try:
            code.append(run.result())
        except Unreachable as exc:
            err.print(f"{exc}: is the stack running? Start it with `sluicegate up` (or pass --api)")
            code.append(UNREACHABLE)
        except ApiError as exc:
            err.print(refusal(exc, settings))
            code.append(REFUSED)


def refusal(exc: ApiError, settings: Settings) -> str:
    if exc.status == 401:
        return (
            f"the API refused the key from {key_source(settings)} ({exc.code}): is it a key of "
            "this stack? (another stack's: set SLUICEGATE_API_KEY)"
        )
    if exc.code == "operator_only":
        return f"refused: {exc.message} (--tenant needs an operator key)"
    return f"refused: {exc}"


def _status(out: Console, api_url: str, window_s: int, watch_s: float | None) -> Action:
    async def action(client: AsyncClient, stop: asyncio.Event) -> int:
        if watch_s is None:
            out.print(views.overview(await client.overview(window_s=window_s), api_url))
            return 0
        if not out.is_terminal:  # a pipe or a file: each view after the last
            show = _printing(out)
            await _watch(client, api_url, window_s, watch_s, stop, show)
            return INTERRUPTED
        with Live(Text(f"reading {api_url} ..."), console=out, auto_refresh=False) as live:
            await _watch(
                client, api_url, window_s, watch_s, stop, lambda r: live.update(r, refresh=True)
            )
        return INTERRUPTED

    return action


async def _watch(
    client: AsyncClient,
    api_url: str,
    window_s: int,
    every_s: float,
    stop: asyncio.Event,
    show: Callable[[RenderableType], None],
) -> None:
    """Show the overview every ``every_s`` until ``stop``; an API that goes away is a line
    in the view (over the last one read), and the next round tries again."""
    last = None
    while not stop.is_set():
        problem = None
        try:
            last = await client.overview(window_s=window_s)
        except (Unreachable, ApiError) as exc:
            problem = f"{exc}; trying again every {every_s:g} s"
        show(views.overview(last, api_url, problem) if last else Text(str(problem)))
        await wait_first(stop, limit_s=every_s)


def _printing(out: Console) -> Callable[[RenderableType], None]:
    def show(view: RenderableType) -> None:
        out.print(view)
        out.print()
        out.file.flush()

    return show


class _Page(Protocol[T]):
    data: list[T]
    next_after: str | None


async def _up_to(
    limit: int, page_of: Callable[[str | None, int], Awaitable[_Page[T]]]
) -> tuple[list[T], bool]:
    """Pages of at most 100 until ``limit`` items; the items, and whether there are more."""
    found: list[T] = []
    after: str | None = None
    while len(found) < limit:
        page = await page_of(after, min(100, limit - len(found)))
        found += page.data
        after = page.next_after
        if after is None:
            return found, False
    return found, after is not None


def _jobs(out: Console, args: argparse.Namespace) -> Action:
    async def action(client: AsyncClient, stop: asyncio.Event) -> int:
        found, more = await _up_to(
            args.limit,
            lambda after, limit: client.list_jobs(
                states=args.state,
                model=args.model,
                tenant=args.tenant,
                batch_id=args.batch,
                after=after,
                limit=limit,
            ),
        )
        out.print(views.job_list(found, more))
        return 0

    return action


def _show(out: Console, job_id: str) -> Action:
    async def action(client: AsyncClient, stop: asyncio.Event) -> int:
        out.print(views.timeline(await client.timeline(job_id)))
        return 0

    return action


def _batches(out: Console, args: argparse.Namespace) -> Action:
    async def action(client: AsyncClient, stop: asyncio.Event) -> int:
        found, more = await _up_to(
            args.limit,
            lambda after, limit: client.list_batches(
                statuses=args.status,
                model=args.model,
                tenant=args.tenant,
                after=after,
                limit=limit,
            ),
        )
        out.print(views.batch_list(found, more))
        return 0

    return action


def _redeliver(out: Console, delivery_id: str) -> Action:
    async def action(client: AsyncClient, stop: asyncio.Event) -> int:
        d = await client.redeliver(delivery_id)
        out.print(f"{d.id}: {d.state.value}, attempt {d.attempts + 1} to {d.url}", highlight=False)
        return 0

    return action
