"""The Files API on the real database: upload, list, read, read the content of and delete
a file, tenant by tenant; bad files and files over the limits refused with nothing stored;
and OpenAI's own client driving it over HTTP."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import OpenAI
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from plumbing.settings import Settings
from producers.api.app import create_app
from producers.files.repository import FileStore
from producers.tenancy.repository import KeyStore
from schemas.tables import file_parts, files
from tests.integration.serving import serve, serving

ACME = {"X-Sluicegate-Tenant": "acme"}
OTHER = {"X-Sluicegate-Tenant": "other"}


def line(custom_id: str, text: str = "Summarize: the gate holds.") -> dict[str, Any]:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": "any", "messages": [{"role": "user", "content": text}]},
    }


def jsonl(*values: object) -> bytes:
    return "".join(json.dumps(v) + "\n" for v in values).encode()


@pytest.fixture
async def api(settings: Settings, db: AsyncEngine) -> AsyncIterator[httpx.AsyncClient]:
    async with serve(settings, db) as client:
        yield client


async def upload(
    api: httpx.AsyncClient,
    data: bytes,
    *,
    purpose: str = "batch",
    headers: dict[str, str] = ACME,
    name: str = "in.jsonl",
) -> httpx.Response:
    return await api.post(
        "/v1/files",
        files={"file": (name, data, "application/jsonl")},
        data={"purpose": purpose},
        headers=headers,
    )


async def stored(db: AsyncEngine) -> tuple[int, int]:
    async with db.connect() as conn:
        n_files = await conn.scalar(select(func.count()).select_from(files))
        n_parts = await conn.scalar(select(func.count()).select_from(file_parts))
    return int(n_files or 0), int(n_parts or 0)


async def test_upload_read_list_and_delete(api: httpx.AsyncClient, db: AsyncEngine) -> None:
    # Over 2 MiB: three parts of about 1 MiB.
    data = jsonl(*(line(f"r{i}", "x" * 1000) for i in range(2500)))
    r = await upload(api, data)
    assert r.status_code == 201, r.text
    created = r.json()
    assert created["id"].startswith("file-")
    assert r.headers["Location"] == f"/v1/files/{created['id']}"
    assert created["object"] == "file"
    assert created["bytes"] == len(data)
    assert created["filename"] == "in.jsonl"
    assert created["purpose"] == "batch"
    assert created["status"] == "processed"
    assert created["expires_at"] is None
    assert created["status_details"] is None
    assert await stored(db) == (1, 3)

    r = await api.get(f"/v1/files/{created['id']}", headers=ACME)
    assert r.status_code == 200
    assert r.json() == created
    r = await api.get(f"/v1/files/{created['id']}/content", headers=ACME)
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/octet-stream"
    assert r.content == data
    got = [(n, raw) async for n, raw in FileStore(db).lines("acme", created["id"])]
    assert len(got) == 2500
    assert got[-1] == (2500, data.splitlines()[-1])

    r = await api.get("/v1/files", headers=ACME)
    assert r.json() == {
        "object": "list",
        "data": [created],
        "first_id": created["id"],
        "last_id": created["id"],
        "has_more": False,
    }

    r = await api.delete(f"/v1/files/{created['id']}", headers=ACME)
    assert r.status_code == 200
    assert r.json() == {"id": created["id"], "object": "file", "deleted": True}
    assert await stored(db) == (0, 0)
    for method, path in [
        ("GET", f"/v1/files/{created['id']}"),
        ("GET", f"/v1/files/{created['id']}/content"),
        ("DELETE", f"/v1/files/{created['id']}"),
    ]:
        r = await api.request(method, path, headers=ACME)
        assert r.status_code == 404
        assert r.json()["error"]["code"] == "file_not_found"


async def test_another_tenants_file_is_404(api: httpx.AsyncClient, db: AsyncEngine) -> None:
    r = await upload(api, jsonl(line("a")))
    file_id = r.json()["id"]
    for method, path in [
        ("GET", f"/v1/files/{file_id}"),
        ("GET", f"/v1/files/{file_id}/content"),
        ("DELETE", f"/v1/files/{file_id}"),
    ]:
        r = await api.request(method, path, headers=OTHER)
        assert r.status_code == 404, (method, path)
        assert r.json()["error"]["code"] == "file_not_found"
    r = await api.get("/v1/files", headers=OTHER)
    assert r.json()["data"] == []
    assert await stored(db) == (1, 1)


async def test_pages_order_and_purpose(api: httpx.AsyncClient) -> None:
    ids = [(await upload(api, jsonl(line(f"f{i}")))).json()["id"] for i in range(5)]
    r = await api.get("/v1/files", params={"limit": 2}, headers=ACME)
    page = r.json()
    assert [f["id"] for f in page["data"]] == ids[::-1][:2]
    assert page["has_more"] is True
    assert page["last_id"] == ids[3]
    r = await api.get("/v1/files", params={"limit": 2, "after": ids[3]}, headers=ACME)
    assert [f["id"] for f in r.json()["data"]] == [ids[2], ids[1]]
    r = await api.get(
        "/v1/files", params={"order": "asc", "after": ids[2], "limit": 10}, headers=ACME
    )
    assert [f["id"] for f in r.json()["data"]] == ids[3:]
    assert r.json()["has_more"] is False
    r = await api.get("/v1/files", params={"purpose": "batch_output"}, headers=ACME)
    assert r.json()["data"] == []
    assert r.json()["first_id"] is None
    r = await api.get("/v1/files", params={"limit": 10_001}, headers=ACME)
    assert r.status_code == 422


async def test_any_jsonl_is_taken_and_its_batch_names_the_bad_lines(
    api: httpx.AsyncClient, db: AsyncEngine
) -> None:
    # Issue 31 changes the requirement: OpenAI takes any JSONL with purpose batch and the
    # batch fails with errors.data; the upload used to be 400 invalid_batch_line.
    def served(custom_id: str) -> dict[str, Any]:
        made = line(custom_id)
        made["body"]["model"] = "sim"
        return made

    bad = {**served("c"), "method": "GET"}
    r = await upload(api, jsonl(served("a"), line("b"), bad, served("a")) + b"{oops\n")
    assert r.status_code == 201, r.text
    assert await stored(db) == (1, 1)
    made = await api.post(
        "/v1/batches",
        json={"input_file_id": r.json()["id"], "endpoint": "/v1/chat/completions"},
        headers=ACME,
    )
    assert (made.status_code, made.json()["status"]) == (201, "validating")
    async with asyncio.timeout(15):
        while (batch := (await api.get(f"/v1/batches/{made.json()['id']}", headers=ACME)).json())[
            "status"
        ] == "validating":
            await asyncio.sleep(0.05)
    assert batch["status"] == "failed"
    assert [(e["line"], e["code"]) for e in batch["errors"]["data"]] == [
        (2, "model_not_found"),
        (3, "invalid_request"),
        (4, "duplicate_custom_id"),
        (5, "invalid_json_line"),
    ]
    assert batch["errors"]["object"] == "list"


@pytest.mark.parametrize("purpose", ["fine-tune", "batch_output", "assistants"])
async def test_other_purposes_are_refused(
    api: httpx.AsyncClient, db: AsyncEngine, purpose: str
) -> None:
    r = await upload(api, jsonl(line("a")), purpose=purpose)
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "unsupported_purpose"
    assert await stored(db) == (0, 0)


async def test_a_form_without_its_fields_is_refused(api: httpx.AsyncClient) -> None:
    r = await api.post("/v1/files", data={"purpose": "batch"}, files={}, headers=ACME)
    assert r.status_code in (400, 422)
    r = await api.post("/v1/files", files={"file": ("in.jsonl", jsonl(line("a")))}, headers=ACME)
    assert r.status_code == 422
    assert "purpose" in r.json()["error"]["message"]


async def test_the_size_and_line_limits(
    settings: Settings, db: AsyncEngine, tmp_path: Path
) -> None:
    small = settings.model_copy(update={"max_file_bytes": 2048, "max_file_lines": 3})
    async with serve(small, db) as api:
        r = await upload(api, jsonl(*(line(f"r{i}") for i in range(3))))
        assert r.status_code == 201, r.text
        r = await upload(api, jsonl(*(line(f"r{i}") for i in range(4))))
        assert r.status_code == 413
        assert r.json()["error"]["code"] == "payload_too_large"
        assert "line 4" in r.json()["error"]["message"]
        big = jsonl(line("a", "x" * 2100))
        r = await upload(api, big)
        assert r.status_code == 413
        assert r.json()["error"]["code"] == "payload_too_large"
        r = await upload(api, big * 40)  # over the body limit too
        assert r.status_code == 413
    assert await stored(db) == (1, 1)


async def test_openai_client(settings: Settings, db: AsyncEngine, tmp_path: Path) -> None:
    keyed = settings.model_copy(update={"auth": "api_key", "api_key_cache_s": 0})
    key = await KeyStore(db).create("acme")
    path = tmp_path / "in.jsonl"
    data = jsonl(line("a"), line("b"))
    path.write_bytes(data)

    def drive(port: int) -> None:
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key, max_retries=0)
        with path.open("rb") as f:
            created = client.files.create(file=f, purpose="batch")
        assert created.bytes == len(data)
        assert created.filename == "in.jsonl"
        assert client.files.retrieve(created.id) == created
        assert client.files.content(created.id).read() == data
        assert [f.id for f in client.files.list()] == [created.id]
        deleted = client.files.delete(created.id)
        assert deleted.deleted
        assert deleted.id == created.id
        assert list(client.files.list()) == []

    async with serving(create_app(keyed, engine=db)) as port:
        await asyncio.to_thread(drive, port)
