"""OpenAI's own client sees every status of a batch's life on the real database, in order:
validating, in_progress, finalizing (held open here: the output file's row is taken by another
transaction, as a slow write of a large output file would hold it), then completed."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime

from openai import OpenAI
from sqlalchemy import insert, update
from sqlalchemy.ext.asyncio import AsyncEngine

from plumbing.settings import Settings
from producers.api.app import create_app
from producers.tenancy.repository import KeyStore
from schemas.batches.output import result_file_id
from schemas.tables import files, jobs
from tests.integration.rows import chat
from tests.integration.serving import serving


def until(client: OpenAI, batch_id: str, status: str, seen: list[str]) -> None:
    """Retrieve the batch until it shows ``status``, noting each status it showed."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        shown = client.batches.retrieve(batch_id).status
        if seen[-1] != shown:
            seen.append(shown)
        if shown == status:
            return
        time.sleep(0.02)
    raise AssertionError(f"batch {batch_id} never showed {status}: {seen}")


async def test_the_openai_client_sees_validating_in_progress_finalizing_completed(
    settings: Settings, db: AsyncEngine
) -> None:
    keyed = settings.model_copy(update={"auth": "api_key", "api_key_cache_s": 0})
    key = await KeyStore(db).create("acme")
    data = "".join(json.dumps(chat(c)) + "\n" for c in ("a", "b")).encode()
    async with serving(create_app(keyed, engine=db)) as port:
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key, max_retries=0)

        def start() -> tuple[str, str]:
            uploaded = client.files.create(file=("in.jsonl", data), purpose="batch")
            made = client.batches.create(
                input_file_id=uploaded.id,
                endpoint="/v1/chat/completions",
                completion_window="24h",
            )
            return made.id, made.status

        batch_id, first = await asyncio.to_thread(start)
        seen = [first]
        await asyncio.to_thread(until, client, batch_id, "in_progress", seen)

        async with db.connect() as holder:
            await holder.execution_options(isolation_level="READ COMMITTED")  # a real one
            held = await holder.begin()
            output = {
                "id": result_file_id(batch_id, "output"),
                "tenant": "acme",
                "filename": "held.jsonl",
                "purpose": "batch_output",
                "bytes": 0,
                "lines": 0,
            }
            await holder.execute(insert(files).values(output))
            result = {"text": "held", "engine": "sim", "prompt_tokens": 3, "output_tokens": 1}
            async with db.begin() as conn:  # the batch's jobs end
                await conn.execute(
                    update(jobs)
                    .where(jobs.c.batch_id == batch_id)
                    .values(state="succeeded", finished_at=datetime.now(UTC), result=result)
                )
            await asyncio.to_thread(until, client, batch_id, "finalizing", seen)
            await asyncio.sleep(0.5)  # still finalizing while its output file is being written
            still = await asyncio.to_thread(client.batches.retrieve, batch_id)
            assert still.status == "finalizing"
            await held.rollback()

        await asyncio.to_thread(until, client, batch_id, "completed", seen)
        done = await asyncio.to_thread(client.batches.retrieve, batch_id)
        assert done.output_file_id is not None
        content = await asyncio.to_thread(client.files.content, done.output_file_id)
        lines = content.text.splitlines()

    assert seen == ["validating", "in_progress", "finalizing", "completed"]
    assert done.in_progress_at is not None
    assert done.finalizing_at is not None
    assert done.completed_at is not None
    assert done.in_progress_at <= done.finalizing_at <= done.completed_at
    assert [json.loads(line)["custom_id"] for line in lines] == ["a", "b"]
    assert json.loads(lines[0])["response"]["body"]["usage"] == {
        "prompt_tokens": 3,
        "completion_tokens": 1,
        "total_tokens": 4,
    }
