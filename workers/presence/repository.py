"""A worker's row in ``workers``: written when its report changes and at least every other
``worker_report_s``, deleted at a clean stop (``workers.presence``); each one statement. A
report joins the worker's next claim transaction (``plumbing.unit_of_work``) when one
comes within its linger."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from sqlalchemy import delete, func
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from plumbing.unit_of_work import UnitOfWork, joining
from schemas.tables import workers


@dataclass(frozen=True, kw_only=True)
class WorkerReport:
    id: str
    model: str
    engine: str
    capacity: int
    running: int
    kv_usage: float | None
    context_tokens: int | None = None


class PresenceRepository:
    def __init__(self, engine: AsyncEngine, work: UnitOfWork | None = None) -> None:
        self._engine = engine
        self._work = work

    async def report(self, report: WorkerReport) -> None:
        values = asdict(report)
        upsert = insert(workers).values(**values)
        changed = {k: v for k, v in values.items() if k != "id"}
        statement = upsert.on_conflict_do_update(
            index_elements=[workers.c.id], set_={**changed, "seen_at": func.now()}
        )

        async def write(conn: AsyncConnection) -> None:
            await conn.execute(statement)

        await joining(self._work, self._engine, write)

    async def leave(self, worker_id: str) -> None:
        async with self._engine.connect() as conn:
            await conn.execute(delete(workers).where(workers.c.id == worker_id))
