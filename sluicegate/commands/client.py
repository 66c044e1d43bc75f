"""``sluicegate submit`` and ``sluicegate summarize``: clients of a running stack. A common
mistake (no stack, a lost connection, a wrong key, bad input) is one line and an exit code,
never a traceback."""

from __future__ import annotations

import argparse
import asyncio
import codecs
import contextlib
from collections.abc import Coroutine
from typing import Any

from pydantic import ValidationError
from rich.console import Console

from client.api import ApiError, AsyncClient, RetryPolicy, Unreachable
from client.summarize.requests import InputError
from plumbing.settings import Settings
from schemas.errors import SluicegateError
from schemas.sampling import SummaryOptions
from sluicegate.local import info as stack_info
from sluicegate.local import key as local_key
from sluicegate.process import run_until_signal

INPUT, PARTIAL, REFUSED, UNREACHABLE, INTERRUPTED = 2, 3, 4, 5, 130
# summarize waits out refusals a retry can turn into a success (each wait is said).
SUMMARIZE_ATTEMPTS = 30


def run(settings: Settings, args: argparse.Namespace) -> int:
    api_url = api_url_of(settings, args.api)
    key = local_key.read_key(settings)
    console = Console(stderr=True, soft_wrap=True)
    if args.command == "summarize" and args.encoding:
        try:
            codecs.lookup(args.encoding)
        except LookupError:
            console.print(f"--encoding: no such encoding {args.encoding!r}", highlight=False)
            return INPUT
    code: list[int] = []
    action = _summarize if args.command == "summarize" else _submit
    run_until_signal(
        lambda stop: _guarded(
            action(settings, api_url, key, args, console),
            stop,
            console,
            settings,
            code,
            resumable=args.command == "summarize",
        )
    )
    return code[0] if code else INTERRUPTED


def api_url_of(settings: Settings, flag: str | None) -> str:
    """--api, else SLUICEGATE_API_HOST/PORT if set, else the local stack's, else the
    defaults."""
    if flag:
        return flag.rstrip("/")
    explicit = {"api_host", "api_port"} & settings.model_fields_set
    if not explicit and (info := stack_info.read_info(settings.data_dir)) is not None:
        return str(info["api"])
    host = "127.0.0.1" if settings.api_host in ("0.0.0.0", "::") else settings.api_host
    return f"http://{host}:{settings.api_port}"


def key_source(settings: Settings) -> str:
    if settings.api_key:
        return "SLUICEGATE_API_KEY"
    return str(local_key.key_file(settings))


async def _guarded(
    action: Coroutine[Any, Any, int],
    stop: asyncio.Event,
    console: Console,
    settings: Settings,
    code: list[int],
    *,
    resumable: bool,
) -> None:
    """Run ``action`` until it ends or a signal comes; its errors become one line each."""
    run = asyncio.ensure_future(action)
    stopped = asyncio.ensure_future(stop.wait())
    await asyncio.wait([run, stopped], return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    if not run.done():
        run.cancel()  # its progress display stops before the last line is said
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await run
        again = "run the same command again to resume" if resumable else "stopped"
        console.print(f"interrupted: {again}", highlight=False)
        return
    try:
        code.append(run.result())
    except (InputError, SluicegateError) as exc:
        console.print(f"[red]{exc}[/red]", highlight=False)
        code.append(INPUT)
    except Unreachable as exc:
        console.print(
            f"[red]{exc}[/red]: is the stack running? Start it with `sluicegate up` (or pass "
            "--api)" + ("; run this again to resume" if resumable else ""),
            highlight=False,
        )
        code.append(UNREACHABLE)
    except ApiError as exc:
        console.print(f"[red]{_refusal(exc, settings)}[/red]", highlight=False)
        code.append(REFUSED)


def _refusal(exc: ApiError, settings: Settings) -> str:
    if exc.status != 401:
        line = f"refused: {exc}"
        return line + "".join(f"\n  {_detail(d)}" for d in exc.details)
    if local_key.read_key(settings) is None:
        return (
            f"the API wants a key and there is none: {key_source(settings)} does not exist. "
            "`sluicegate up` makes it for the local stack; for another stack set "
            "SLUICEGATE_API_KEY (keys come from `sluicegate keys create`)"
        )
    return (
        f"the API refused the key from {key_source(settings)} ({exc.code}: {exc.message}); "
        "is it a key of this stack?"
    )


def _detail(detail: object) -> str:
    if isinstance(detail, dict) and "custom_id" in detail:
        return f"{detail['custom_id']}: {detail.get('message', detail.get('code'))}"
    return str(detail)


def summary_of(args: argparse.Namespace) -> SummaryOptions | None:
    """The summary ``--style``, ``--instructions``, ``--language`` and ``--words`` ask for
    (None: none of them given); InputError naming the flag when one is out of bounds."""
    given = {
        "style": args.style,
        "instructions": args.instructions,
        "language": args.language,
        "words": args.words,
    }
    if all(value is None for value in given.values()):
        return None
    try:
        return SummaryOptions.model_validate(given)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        flags = [f"--{field}" for field in error["loc"]] or ["--style", "--instructions"]
        message = str(error["msg"]).removeprefix("Value error, ")
        raise InputError(f"{' and '.join(flags)}: {message}") from None


async def _summarize(
    settings: Settings, api_url: str, key: str | None, args: argparse.Namespace, console: Console
) -> int:
    from client.summarize.run import Options, refusal_line, summarize

    options = Options(
        window=args.deadline,
        out=args.out,
        max_tokens=args.max_tokens,
        max_bytes=settings.max_input_bytes,
        encoding=args.encoding,
        strict=args.strict,
        new=args.new,
        limits=settings.documents.limits(),
        summary=summary_of(args),
    )

    def waiting(refusal: ApiError, wait_s: float) -> None:
        console.print(refusal_line(refusal, wait_s), highlight=False, markup=False)

    async with AsyncClient(
        api_url, api_key=key, retry=RetryPolicy(max_attempts=SUMMARIZE_ATTEMPTS), on_wait=waiting
    ) as client:
        return await summarize(client, args.source, options, console)


async def _submit(
    settings: Settings, api_url: str, key: str | None, args: argparse.Namespace, console: Console
) -> int:
    from client.demo import read_documents
    from schemas.jobs import JobKind

    docs, skipped = read_documents(args.files, max_bytes=settings.max_input_bytes)
    for skip in skipped:
        console.print(f"skipped {skip.name}: {skip.message}", highlight=False, markup=False)
    if not docs:
        console.print("nothing to submit", highlight=False)
        return INPUT
    async with AsyncClient(api_url, api_key=key, retry=RetryPolicy()) as client:
        for name, text in docs:
            try:
                answer = await client.submit(
                    JobKind.SUMMARIZE, text, max_tokens=args.max_tokens, ttl_s=args.ttl
                )
            except ApiError:
                console.print(f"{name}: not submitted", highlight=False, markup=False)
                raise
            print(f"{name}\t{answer.id}\t{api_url}{answer.status_url}", flush=True)
    return PARTIAL if skipped else 0
