"""``sluicegate keys``: make, list or revoke API keys in the database of the stack in use: the
configured SLUICEGATE_DATABASE_URL, else the local stack running on the data directory."""

from __future__ import annotations

import argparse
import asyncio
import sys

from rich.console import Console
from rich.table import Table
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from plumbing.db import make_engine
from plumbing.settings import Settings
from producers.tenancy.repository import KeyInfo, KeyStore
from sluicegate.local import info as stack_info


def database_url(settings: Settings) -> str | None:
    if settings.database_url:
        return settings.database_url
    info = stack_info.read_info(settings.data_dir)
    return None if info is None else str(info["database"])


def run(settings: Settings, args: argparse.Namespace) -> int:
    url = database_url(settings)
    if url is None:
        print(
            f"no database: no local stack runs on {settings.data_dir} and "
            "SLUICEGATE_DATABASE_URL is not set. Start the stack (`sluicegate up`) and run this "
            "again, or set SLUICEGATE_DATABASE_URL",
            file=sys.stderr,
        )
        return 2
    try:
        return asyncio.run(_keys(url, args))
    except (OSError, DBAPIError, SQLAlchemyError) as exc:
        reason = str(getattr(exc, "orig", None) or exc).splitlines()[0]
        print(f"cannot reach the database: {reason}", file=sys.stderr)
        return 5


async def _keys(url: str, args: argparse.Namespace) -> int:
    db = make_engine(url, pool_size=1)
    try:
        store = KeyStore(db)
        if args.keys_command == "create":
            print(await store.create(args.tenant, name=args.name, operator=args.operator))
            return 0
        if args.keys_command == "list":
            _print_keys(await store.list())
            return 0
        if await store.revoke(args.key_id):
            print(f"revoked {args.key_id}")
            return 0
        print(f"no active key {args.key_id}", file=sys.stderr)
        return 1
    finally:
        await db.dispose()


def _print_keys(keys: list[KeyInfo]) -> None:
    table = Table("id", "tenant", "name", "operator", "created", "revoked", box=None)
    for key in keys:
        table.add_row(
            key.id,
            key.tenant,
            key.name or "",
            "yes" if key.operator else "",
            f"{key.created_at:%Y-%m-%d %H:%M:%S}",
            f"{key.revoked_at:%Y-%m-%d %H:%M:%S}" if key.revoked_at else "",
        )
    if keys:
        Console(width=200).print(table)
    else:
        print("no keys")
