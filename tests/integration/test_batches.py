"""Batches over the API on the real database: the three input forms, whole-batch refusal of
bad lines, acceptance over the lag, idempotency, results in the OpenAI output shape,
cancel, tenancy."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from sqlalchemy import event, func, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from plumbing.settings import Settings
from schemas.tables import batches, jobs, outbox
from tests.integration.rows import chat
from tests.integration.serving import serve

TENANT = {"X-Sluicegate-Tenant": "acme"}


def jsonl(lines: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


@pytest.fixture
async def api(settings: Settings, db: AsyncEngine) -> AsyncIterator[httpx.AsyncClient]:
    async with serve(settings.model_copy(update={"lag_hard": 10}), db) as client:
        yield client


async def create(api: httpx.AsyncClient, n: int, **extra: Any) -> dict[str, Any]:
    body = {"requests": [chat(f"r{i}") for i in range(n)], "completion_window": "30m", **extra}
    r = await api.post("/v1/batches", json=body, headers=TENANT)
    assert r.status_code == 201, r.text
    batch: dict[str, Any] = r.json()
    return batch


async def count(db: AsyncEngine, table: Any) -> int:
    async with db.connect() as conn:
        return int(await conn.scalar(select(func.count()).select_from(table)) or 0)


async def until_count(db: AsyncEngine, table: Any, n: int, within_s: float = 10.0) -> None:
    async with asyncio.timeout(within_s):
        while await count(db, table) != n:
            await asyncio.sleep(0.05)


async def test_a_json_batch_is_stored_whole_then_metered_into_the_outbox(
    api: httpx.AsyncClient, db: AsyncEngine
) -> None:
    writes: list[str] = []

    def seen(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        # The lag reader's statement (it stores its reading) runs beside, on the same engine.
        if "INSERT" in statement.upper() and "lag_readings" not in statement:
            writes.append(statement)

    event.listen(db.sync_engine, "before_cursor_execute", seen)
    try:
        before = datetime.now(UTC)
        batch = await create(api, 3, metadata={"run": "nightly"})
    finally:
        event.remove(db.sync_engine, "before_cursor_execute", seen)
    # The batch, then its jobs (one statement per chunk of 1,000), held; their dispatch
    # records are the meter's to write.
    assert [w.split("(")[0].split()[-1] for w in writes[:2]] == ["batches", "jobs"]
    assert batch["object"] == "batch"
    assert batch["status"] == "in_progress"
    assert batch["endpoint"] == "/v1/chat/completions"
    assert batch["request_counts"] == {"total": 3, "completed": 0, "failed": 0}
    assert batch["counts"] == {"queued": 3}
    assert batch["metadata"] == {"run": "nightly"}
    assert abs(batch["expires_at"] - (before.timestamp() + 1800)) < 5
    async with db.connect() as conn:
        rows = (
            await conn.execute(
                select(jobs.c.custom_id, jobs.c.kind, jobs.c.input, jobs.c.max_tokens)
                .where(jobs.c.batch_id == batch["id"])
                .order_by(jobs.c.id)
            )
        ).all()
    assert [r.custom_id for r in rows] == ["r0", "r1", "r2"]
    assert {r.kind for r in rows} == {"complete"}
    assert rows[0].input.startswith("user: Summarize")
    assert {r.max_tokens for r in rows} == {32}
    await until_count(db, outbox, 3)  # released by the meter, the lag being low


async def test_jsonl_upload_and_raw_jsonl(api: httpx.AsyncClient) -> None:
    lines = [chat("a"), chat("b")]
    r = await api.post(
        "/v1/batches",
        files={"file": ("input.jsonl", jsonl(lines), "application/jsonl")},
        data={"completion_window": "1h", "metadata": '{"k": "v"}'},
        headers=TENANT,
    )
    assert r.status_code == 201, r.text
    assert r.json()["completion_window"] == "1h"
    assert r.json()["metadata"] == {"k": "v"}
    assert r.json()["request_counts"]["total"] == 2
    r = await api.post(
        "/v1/batches?completion_window=2h",
        content=jsonl(lines),
        headers={**TENANT, "Content-Type": "application/x-ndjson"},
    )
    assert r.status_code == 201, r.text
    assert r.json()["completion_window"] == "2h"


async def test_a_bad_line_refuses_the_whole_batch(api: httpx.AsyncClient, db: AsyncEngine) -> None:
    bad_url = {**chat("c"), "url": "/v1/embeddings"}
    blank = {**chat("d"), "body": {"messages": []}}
    lines = [chat("a"), bad_url, chat("a"), blank, {"custom_id": "e"}]
    r = await api.post("/v1/batches", json={"requests": lines}, headers=TENANT)
    assert r.status_code == 422
    error = r.json()["error"]
    assert error["code"] == "invalid_batch"
    assert [(d["line"], d["code"]) for d in error["details"]] == [
        (2, "invalid_request"),
        (3, "duplicate_custom_id"),
        (4, "invalid_request"),
        (5, "invalid_request"),
    ]
    mixed = [chat("a"), {**chat("b"), "url": "/v1/completions", "body": {"prompt": "x"}}]
    r = await api.post("/v1/batches", json={"requests": mixed}, headers=TENANT)
    assert r.json()["error"]["details"][0]["code"] == "mixed_urls"
    r = await api.post(
        "/v1/batches",
        content=b'{"custom_id": "a"}\nnot json\n',
        headers={**TENANT, "Content-Type": "application/jsonl"},
    )
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "invalid_jsonl"
    assert r.json()["error"]["details"] == [{"line": 2}]
    r = await api.post(
        "/v1/batches", json={"requests": [chat("a")], "completion_window": "soon"}, headers=TENANT
    )
    assert r.json()["error"]["code"] == "invalid_completion_window"
    r = await api.post("/v1/batches", content=b"x", headers={"Content-Type": "text/plain"})
    assert r.status_code == 415
    assert r.json()["error"]["code"] == "unsupported_media_type"
    assert await count(db, batches) == 0
    assert await count(db, jobs) == 0
    assert await count(db, outbox) == 0


async def test_a_batch_over_lag_hard_is_accepted_whole(
    api: httpx.AsyncClient, db: AsyncEngine
) -> None:
    # lag_hard is 10: a batch of 25 is accepted (held, then metered in), and so is a
    # second one beside it; the lines are stored whole.
    await create(api, 25)
    await create(api, 5)
    assert await count(db, jobs) == 30


async def test_idempotent_replay(api: httpx.AsyncClient, db: AsyncEngine) -> None:
    body = {"requests": [chat("a"), chat("b")]}
    key = {**TENANT, "Idempotency-Key": "nightly-42"}
    first = await api.post("/v1/batches", json=body, headers=key)
    again = await api.post("/v1/batches", json=body, headers=key)
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.json()["id"] == first.json()["id"]
    assert await count(db, jobs) == 2
    other = await api.post("/v1/batches", json={"requests": [chat("c")]}, headers=key)
    assert other.status_code == 409
    assert other.json()["error"]["code"] == "idempotency_key_reused"


async def finish(db: AsyncEngine, batch_id: str, custom_ids: list[str]) -> None:
    """What a worker writes for a succeeded job."""
    async with db.begin() as conn:
        await conn.execute(
            update(jobs)
            .where(jobs.c.batch_id == batch_id, jobs.c.custom_id.in_(custom_ids))
            .values(
                state="succeeded",
                finished_at=func.now(),
                decoded_tokens=5,
                result={
                    "text": "Gates hold.",
                    "engine": "sim",
                    "prompt_tokens": 12,
                    "output_tokens": 5,
                },
            )
        )


async def results(api: httpx.AsyncClient, batch_id: str, **params: str) -> list[dict[str, Any]]:
    r = await api.get(f"/v1/batches/{batch_id}/results", params=params, headers=TENANT)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("application/jsonl")
    return [json.loads(line) for line in r.text.splitlines()]


async def test_results_follow_submission_order_up_to_the_first_unfinished(
    api: httpx.AsyncClient, db: AsyncEngine
) -> None:
    batch = await create(api, 4)
    assert await results(api, batch["id"]) == []
    await finish(db, batch["id"], ["r0", "r2"])
    got = await results(api, batch["id"])
    assert [line["custom_id"] for line in got] == ["r0"]  # r1 has not ended: stop there
    line = got[0]
    assert line["id"] == f"batch_req_{line['sluicegate']['job_id']}"
    assert line["error"] is None
    assert line["response"]["status_code"] == 200
    body = line["response"]["body"]
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "Gates hold."}
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"] == {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17}
    assert line["sluicegate"]["state"] == "succeeded"

    await finish(db, batch["id"], ["r1"])
    rest = await results(api, batch["id"], after=line["sluicegate"]["job_id"])
    assert [x["custom_id"] for x in rest] == ["r1", "r2"]

    view = (await api.post(f"/v1/batches/{batch['id']}/cancel", headers=TENANT)).json()
    # r3 was the last one running: cancelling, then cancelled once its files are written
    # (issue 31: the cancel answered cancelled at once, with no finalizing step).
    assert view["status"] == "cancelling"
    assert view["counts"] == {"succeeded": 3, "cancelled": 1}
    view = await until_status(api, batch["id"], "cancelled")
    assert view["cancelling_at"] <= view["finalizing_at"] <= view["cancelled_at"]
    assert view["output_file_id"] == f"file-{batch['id']}-output"
    assert view["error_file_id"] == f"file-{batch['id']}-error"
    assert view["request_counts"] == {"total": 4, "completed": 3, "failed": 1}
    everything = await results(api, batch["id"])
    assert [x["custom_id"] for x in everything] == ["r0", "r1", "r2", "r3"]
    assert everything[3]["response"] is None
    assert everything[3]["error"]["code"] == "cancelled"
    assert everything[3]["sluicegate"]["state"] == "cancelled"


async def test_cancel_ends_every_unfinished_job_with_its_event(
    api: httpx.AsyncClient, db: AsyncEngine
) -> None:
    batch = await create(api, 3)
    await finish(db, batch["id"], ["r0"])
    r = await api.post(f"/v1/batches/{batch['id']}/cancel", headers=TENANT)
    assert r.status_code == 200
    assert r.json()["counts"] == {"succeeded": 1, "cancelled": 2}
    assert (r.json()["status"], r.json()["cancelled_at"]) == ("cancelling", None)
    assert r.json()["cancelling_at"] is not None
    ended = await until_status(api, batch["id"], "cancelled")
    assert ended["cancelled_at"] is not None
    async with db.connect() as conn:
        events = await conn.scalar(
            select(func.count()).select_from(outbox).where(outbox.c.topic.like("%events%"))
        )
    assert events == 2
    again = await api.post(f"/v1/batches/{batch['id']}/cancel", headers=TENANT)
    assert again.status_code == 200
    done = await create(api, 1)
    await finish(db, done["id"], ["r0"])
    r = await api.post(f"/v1/batches/{done['id']}/cancel", headers=TENANT)
    assert r.status_code == 409
    assert r.json()["error"]["code"] == "batch_terminal"


async def test_another_tenants_batch_is_404(api: httpx.AsyncClient) -> None:
    batch = await create(api, 1)
    other = {"X-Sluicegate-Tenant": "globex"}
    for method, path in [
        ("GET", f"/v1/batches/{batch['id']}"),
        ("GET", f"/v1/batches/{batch['id']}/results"),
        ("POST", f"/v1/batches/{batch['id']}/cancel"),
        ("GET", "/v1/batches/not-a-uuid"),
    ]:
        r = await api.request(method, path, headers=other)
        assert r.status_code == 404, path
        assert r.json()["error"]["code"] == "batch_not_found"
    assert (await api.get("/v1/batches", headers=other)).json()["data"] == []
    mine = (await api.get("/v1/batches", headers=TENANT)).json()["data"]
    assert [b["id"] for b in mine] == [batch["id"]]
    r = await api.get("/v1/jobs", params={"batch_id": batch["id"]}, headers=other)
    assert r.json()["data"] == []


async def test_the_list_pages_as_openai_lists_do(api: httpx.AsyncClient) -> None:
    made = [(await create(api, 1))["id"] for _ in range(3)]
    seen: list[str] = []
    after: str | None = None
    while True:
        params = {"limit": 2, **({"after": after} if after else {})}
        page = (await api.get("/v1/batches", params=params, headers=TENANT)).json()
        assert page["object"] == "list"
        ids = [b["id"] for b in page["data"]]
        assert (page["first_id"], page["last_id"]) == (ids[0], ids[-1])
        assert page["next_after"] == (page["last_id"] if page["has_more"] else None)
        seen += ids
        if not page["has_more"]:
            break
        after = page["last_id"]
    assert seen == made[::-1]


async def until_status(
    api: httpx.AsyncClient, batch_id: str, *statuses: str, within_s: float = 15.0
) -> dict[str, Any]:
    async with asyncio.timeout(within_s):
        while (batch := (await api.get(f"/v1/batches/{batch_id}", headers=TENANT)).json())[
            "status"
        ] not in statuses:
            await asyncio.sleep(0.05)
    found: dict[str, Any] = batch
    return found


async def upload(api: httpx.AsyncClient, data: bytes) -> str:
    r = await api.post(
        "/v1/files", files={"file": ("in.jsonl", data)}, data={"purpose": "batch"}, headers=TENANT
    )
    assert r.status_code == 201, r.text
    file_id: str = r.json()["id"]
    return file_id


async def test_a_batch_from_an_uploaded_file_saved_with_a_byte_order_mark(
    api: httpx.AsyncClient,
) -> None:
    data = b"\xef\xbb\xbf" + jsonl([chat("a"), chat("b")]).replace(b"\n", b"\r\n")
    file_id = await upload(api, data)
    body = {"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "1h"}
    made = await api.post("/v1/batches", json=body, headers=TENANT)
    assert made.status_code == 201, made.text
    assert (made.json()["input_file_id"], made.json()["status"]) == (file_id, "validating")
    going = await until_status(api, made.json()["id"], "in_progress", "failed")
    assert (going["status"], going["request_counts"]["total"]) == ("in_progress", 2), going
    assert going["in_progress_at"] >= going["created_at"]
    # Issue 31 changes the requirement: a file's lines are checked in the batch (OpenAI's
    # validating -> failed), no longer refused at create (422 invalid_batch).
    wrong = await api.post(
        "/v1/batches", json={**body, "endpoint": "/v1/completions"}, headers=TENANT
    )
    assert wrong.status_code == 201, wrong.text
    failed = await until_status(api, wrong.json()["id"], "failed", "in_progress")
    assert failed["status"] == "failed"
    assert failed["failed_at"] is not None
    assert [(e["line"], e["code"]) for e in failed["errors"]["data"]] == [
        (1, "mixed_urls"),
        (2, "mixed_urls"),
    ]
    raw = await api.post(
        "/v1/batches?completion_window=1h",
        content=data,
        headers={**TENANT, "Content-Type": "application/jsonl"},
    )
    assert raw.status_code == 201, raw.text
    assert raw.json()["status"] == "in_progress"  # a batch sent whole is checked at once


async def test_a_batch_from_a_file_is_written_a_chunk_at_a_time_or_not_at_all(
    api: httpx.AsyncClient, db: AsyncEngine
) -> None:
    lines = [chat(f"r{i}") for i in range(2_500)]
    file_id = await upload(api, jsonl(lines))
    writes: list[str] = []

    def seen(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.lstrip().upper().startswith("INSERT INTO JOBS"):
            writes.append(statement)

    body = {"input_file_id": file_id, "endpoint": "/v1/chat/completions"}
    key = {**TENANT, "Idempotency-Key": "from-file"}
    event.listen(db.sync_engine, "before_cursor_execute", seen)
    try:
        made = await api.post("/v1/batches", json=body, headers=key)
        assert made.status_code == 201, made.text
        going = await until_status(api, made.json()["id"], "in_progress", "failed")
    finally:
        event.remove(db.sync_engine, "before_cursor_execute", seen)
    assert going["request_counts"]["total"] == 2_500
    assert len(writes) == 3  # 1,000 + 1,000 + 500 lines: never the whole file at once
    again = await api.post("/v1/batches", json=body, headers=key)
    assert (again.status_code, again.json()["id"]) == (200, made.json()["id"])

    # A line the upload takes but a batch refuses (a model not served), in the last chunk,
    # and a line that is not JSON: the chunks already written are rolled back, the batch
    # fails and names the lines (issue 31: was 422 invalid_batch at create).
    unknown = chat("last")
    unknown["body"]["model"] = "no-such-model"
    other = await upload(api, jsonl([*lines[:2_400], unknown]) + b"{oops\n")
    refused = await api.post("/v1/batches", json={**body, "input_file_id": other}, headers=TENANT)
    assert refused.status_code == 201, refused.text
    failed = await until_status(api, refused.json()["id"], "failed", "in_progress")
    assert failed["status"] == "failed", failed
    assert [(e["line"], e["code"], e["param"]) for e in failed["errors"]["data"]] == [
        (2_401, "model_not_found", "body.model"),
        (2_402, "invalid_json_line", None),
    ]
    assert failed["request_counts"]["total"] == 0
    assert await count(db, jobs) == 2_500
    assert await count(db, batches) == 2


async def test_a_batch_left_validating_is_taken_up_by_the_next_api(
    settings: Settings, db: AsyncEngine
) -> None:
    """An API that stored a batch and stopped before checking it: the next one does."""
    from producers.batches.repository import BatchStore, NewBatch
    from schemas.jobs import Priority

    async with serve(settings, db) as first:
        file_id = await upload(first, jsonl([chat("a"), chat("b"), chat("c")]))
    new = NewBatch(
        tenant="acme",
        endpoint=None,
        completion_window="1h",
        deadline=datetime.now(UTC).replace(year=2100),
        priority=Priority.NORMAL,
        callback_url=None,
        metadata=None,
        idempotency_key=None,
        request_hash=None,
        input_file_id=file_id,
    )
    store = BatchStore(db, events_topic=settings.events_topic)
    view, _ = await store.create_validating(new, lines=3, admit=lambda jobs, held: None)
    assert view.status == "validating"
    assert await count(db, jobs) == 0
    async with serve(settings, db) as second:
        going = await until_status(second, view.id, "in_progress", "failed")
    assert (going["status"], going["request_counts"]["total"]) == ("in_progress", 3)
    assert going["endpoint"] == "/v1/chat/completions"
    assert await count(db, jobs) == 3


async def test_a_batch_is_admitted_on_its_own_models_pool(
    settings: Settings, db: AsyncEngine
) -> None:
    """alpha's pool never has a fresh lag reading (it goes stale at once), beta's has: a
    batch of alpha's lines is refused (503), one of beta's accepted, whether its lines
    come inline or in an uploaded file (admitted on its first line's model)."""
    pools = {"alpha": {"lag_stale_after_s": 0.001}, "beta": {}}
    pooled = settings.model_copy(update={"pools": pools, "models": list(pools)})

    def line(i: int, model: str) -> dict[str, Any]:
        found = chat(f"{model}-{i}")
        found["body"]["model"] = model
        return found

    async with serve(pooled, db) as api:
        for model, status in (("alpha", 503), ("beta", 201)):
            lines = [line(i, model) for i in range(3)]
            inline = {"requests": lines, "completion_window": "1h"}
            file_id = await upload(api, jsonl(lines))
            uploaded = {
                "input_file_id": file_id,
                "endpoint": "/v1/chat/completions",
                "completion_window": "1h",
            }
            for body in (inline, uploaded):
                r = await api.post("/v1/batches", json=body, headers=TENANT)
                assert r.status_code == status, (model, r.text)
