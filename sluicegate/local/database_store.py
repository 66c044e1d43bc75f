"""The embedded server's one statement of its own: create the stack's database if missing."""

from __future__ import annotations

import asyncio


def ensure_database(admin_url: str, name: str) -> None:
    """Create database ``name`` on the server at ``admin_url`` unless it exists. Blocks."""

    async def create() -> None:
        import asyncpg

        conn = await asyncpg.connect(admin_url)
        try:
            exists = await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name)
            if not exists:
                await conn.execute(f'CREATE DATABASE "{name}"')
        finally:
            await conn.close()

    asyncio.run(create())
