"""The API's SQL for uploaded files: a file's row and its content in parts of about 1 MiB,
written in one transaction, read a part at a time. Every query is scoped to the tenant."""

from __future__ import annotations

import secrets
from collections.abc import AsyncGenerator, AsyncIterable
from typing import Any

from sqlalchemy import Row, and_, delete, insert, or_, select, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from plumbing.db import transaction
from producers.files.checks import LineSplitter
from schemas.files import FILE_ID_PREFIX, FileNotFound, FileObject, Order, file_from_row
from schemas.tables import file_parts, files

PART_BYTES = 1_048_576


def new_file_id() -> str:
    return FILE_ID_PREFIX + secrets.token_hex(12)


class FileStore:
    def __init__(self, engine: AsyncEngine, *, part_bytes: int = PART_BYTES) -> None:
        self._engine = engine
        self._part_bytes = part_bytes

    async def create(
        self, tenant: str, filename: str, purpose: str, chunks: AsyncIterable[bytes]
    ) -> FileObject:
        """Store a file whose content is ``chunks``, in one transaction: when the chunks
        raise (a check failed), nothing is stored."""
        async with transaction(self._engine) as conn:
            made = await self.create_in(conn, new_file_id(), tenant, filename, purpose, chunks)
        assert made is not None
        return made

    async def create_in(
        self,
        conn: AsyncConnection,
        file_id: str,
        tenant: str,
        filename: str,
        purpose: str,
        chunks: AsyncIterable[bytes],
        *,
        keep_empty: bool = True,
    ) -> FileObject | None:
        """Store file ``file_id`` in the caller's transaction (a batch's result file is
        written with its batch's end); None when it is empty and not ``keep_empty``."""
        await conn.execute(
            insert(files).values(
                id=file_id, tenant=tenant, filename=filename, purpose=purpose, bytes=0, lines=0
            )
        )
        size, lines = await self._write_parts(conn, file_id, chunks)
        if size == 0 and not keep_empty:
            await conn.execute(delete(files).where(files.c.id == file_id))
            return None
        row = (
            await conn.execute(
                update(files)
                .where(files.c.id == file_id)
                .values(bytes=size, lines=lines)
                .returning(*files.c)
            )
        ).one()
        return file_from_row(row._mapping)

    async def _write_parts(
        self, conn: AsyncConnection, file_id: str, chunks: AsyncIterable[bytes]
    ) -> tuple[int, int]:
        """Write the chunks as parts; the file's size and number of lines."""
        size = newlines = seq = 0
        last = b""
        part = bytearray()
        async for chunk in chunks:
            if not chunk:
                continue
            size += len(chunk)
            newlines += chunk.count(b"\n")
            last = chunk[-1:]
            part += chunk
            if len(part) >= self._part_bytes:
                await conn.execute(insert(file_parts).values(file_id=file_id, seq=seq, data=part))
                seq += 1
                part = bytearray()
        if part:
            await conn.execute(insert(file_parts).values(file_id=file_id, seq=seq, data=part))
        return size, newlines + (1 if last not in (b"", b"\n") else 0)

    async def get(self, tenant: str, file_id: str) -> FileObject:
        async with self._engine.connect() as conn:
            row = await self._row(conn, tenant, file_id)
        return file_from_row(row._mapping)

    async def with_lines(self, tenant: str, file_id: str) -> tuple[FileObject, int]:
        """The file and its number of lines (blank ones too)."""
        async with self._engine.connect() as conn:
            row = await self._row(conn, tenant, file_id)
        return file_from_row(row._mapping), int(row.lines)

    async def _row(self, conn: AsyncConnection, tenant: str, file_id: str) -> Row[Any]:
        row = (
            await conn.execute(
                select(*files.c).where(files.c.id == file_id, files.c.tenant == tenant)
            )
        ).first()
        if row is None:
            raise FileNotFound(f"no file {file_id}")
        return row

    async def list(
        self,
        tenant: str,
        *,
        purpose: str | None = None,
        after: str | None = None,
        limit: int = 10_000,
        order: Order = "desc",
    ) -> tuple[list[FileObject], bool]:
        """A page of the tenant's files by creation time, after file ``after``; and whether
        more follow."""
        query = select(*files.c).where(files.c.tenant == tenant)
        if purpose is not None:
            query = query.where(files.c.purpose == purpose)
        keys = (files.c.created_at, files.c.id)
        if after is not None:
            at = (
                select(files.c.created_at)
                .where(files.c.id == after, files.c.tenant == tenant)
                .scalar_subquery()
            )
            if order == "asc":
                query = query.where(
                    or_(files.c.created_at > at, and_(files.c.created_at == at, files.c.id > after))
                )
            else:
                query = query.where(
                    or_(files.c.created_at < at, and_(files.c.created_at == at, files.c.id < after))
                )
        ordered = keys if order == "asc" else tuple(k.desc() for k in keys)
        async with self._engine.connect() as conn:
            rows = (await conn.execute(query.order_by(*ordered).limit(limit + 1))).all()
        return [file_from_row(r._mapping) for r in rows[:limit]], len(rows) > limit

    async def delete(self, tenant: str, file_id: str) -> None:
        """Delete the file and its parts (FileNotFound when there is none)."""
        async with transaction(self._engine) as conn:
            gone = await conn.scalar(
                delete(files)
                .where(files.c.id == file_id, files.c.tenant == tenant)
                .returning(files.c.id)
            )
        if gone is None:
            raise FileNotFound(f"no file {file_id}")

    async def content(self, tenant: str, file_id: str) -> AsyncGenerator[bytes, None]:
        """The file's bytes, a part at a time, from one snapshot (a file deleted meanwhile
        is still read whole). FileNotFound before the first part when there is no file."""
        async with self._engine.connect() as conn:
            await conn.execution_options(isolation_level="REPEATABLE READ")
            async with conn.begin():
                await self._row(conn, tenant, file_id)
                seq = -1
                while True:
                    part = (
                        await conn.execute(
                            select(file_parts.c.seq, file_parts.c.data)
                            .where(file_parts.c.file_id == file_id, file_parts.c.seq > seq)
                            .order_by(file_parts.c.seq)
                            .limit(1)
                        )
                    ).first()
                    if part is None:
                        return
                    seq = part.seq
                    yield bytes(part.data)

    async def lines(self, tenant: str, file_id: str) -> AsyncGenerator[tuple[int, bytes], None]:
        """The file's non-blank lines with their numbers (from 1, blank lines counted),
        without their newline. FileNotFound before the first when there is no file."""
        splitter = LineSplitter()
        async for chunk in self.content(tenant, file_id):
            for number, line in splitter.feed(chunk):
                if line.strip():
                    yield number, line
        for number, line in splitter.end():
            if line.strip():
                yield number, line
