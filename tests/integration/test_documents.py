"""POST /v1/documents against a real, migrated PostgreSQL database and the broker: a file
as people keep it becomes a summarize job through POST /v1/jobs' own path, and a file that
cannot be read is a 4xx with its reason's code, nothing stored."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from plumbing.db import make_engine
from plumbing.settings import Settings
from producers.api.app import create_app
from schemas.tables import jobs
from tests.support import documents as make

DOCUMENT_MAX_BYTES = 256 * 1024


@pytest.fixture
async def db(settings: Settings) -> AsyncIterator[AsyncEngine]:
    engine = make_engine(settings.require_database_url(), pool_size=2)
    yield engine
    await engine.dispose()


@pytest.fixture
async def api(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    limits = {"document_max_bytes": DOCUMENT_MAX_BYTES, "max_input_bytes": 256 * 1024}
    app = create_app(settings.model_copy(update=limits))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://sg") as client:
            yield client


async def stored(db: AsyncEngine) -> list[tuple[str, str, int]]:
    """The jobs stored: (kind, input, max_tokens), oldest first."""
    async with db.connect() as conn:
        rows = await conn.execute(
            select(jobs.c.kind, jobs.c.input, jobs.c.max_tokens).order_by(jobs.c.id)
        )
        return [(str(kind), str(text), int(tokens)) for kind, text, tokens in rows]


async def count(db: AsyncEngine) -> int:
    async with db.connect() as conn:
        return int((await conn.execute(select(func.count()).select_from(jobs))).scalar_one())


async def test_a_pdf_becomes_a_summarize_job_of_its_text(
    api: httpx.AsyncClient, db: AsyncEngine, tmp_path: Path
) -> None:
    pdf = make.text_pdf(tmp_path / "report.pdf", pages=3)
    with pdf.open("rb") as file:
        response = await api.post(
            "/v1/documents",
            files={"file": ("report.pdf", file, "application/pdf")},
            data={"max_tokens": "64", "ttl_s": "120", "priority": "high"},
        )
    assert response.status_code == 202, response.text
    body = response.json()
    assert response.headers["location"] == body["status_url"] == f"/v1/jobs/{body['id']}"
    assert body["state"] == "queued"
    [(kind, text, max_tokens)] = await stored(db)
    assert (kind, max_tokens) == ("summarize", 64)
    assert text.count("Chapter ") == 3
    view = (await api.get(body["status_url"])).json()
    assert (view["kind"], view["priority"]) == ("summarize", "high")


async def test_a_web_page_is_submitted_without_its_navigation(
    api: httpx.AsyncClient, db: AsyncEngine, tmp_path: Path
) -> None:
    page = make.web_page(tmp_path / "gate.html").read_bytes()
    response = await api.post("/v1/documents", files={"file": ("gate.html", page)})
    assert response.status_code == 202, response.text
    [(_, text, _)] = await stored(db)
    assert text.startswith(f"# {make.ARTICLE_HEADING}")
    assert not any(token in text for token in make.BOILERPLATE_TOKENS)


async def test_the_same_idempotency_key_replays_the_job(
    api: httpx.AsyncClient, db: AsyncEngine, tmp_path: Path
) -> None:
    minutes = make.word_document(tmp_path / "minutes.docx").read_bytes()
    files = {"file": ("minutes.docx", minutes)}
    first = await api.post("/v1/documents", files=files, data={"idempotency_key": "m-1"})
    again = await api.post("/v1/documents", files=files, headers={"Idempotency-Key": "m-1"})
    assert first.status_code == 202, first.text
    assert again.status_code == 200, again.text
    assert again.headers["idempotent-replayed"] == "true"
    assert again.json()["id"] == first.json()["id"]
    assert await count(db) == 1


async def test_a_file_that_cannot_be_read_is_its_reason_and_nothing_is_stored(
    api: httpx.AsyncClient, db: AsyncEngine, tmp_path: Path
) -> None:
    cases = {
        "sheet.xlsx": (b"PK\x03\x04", 415, "unsupported_format"),
        "secret.pdf": (make.encrypted_pdf(tmp_path / "s.pdf").read_bytes(), 422, "encrypted_pdf"),
        "scan.pdf": (make.scanned_pdf(tmp_path / "c.pdf").read_bytes(), 422, "no_text_layer"),
        "broken.pdf": (b"%PDF-1.7\n" + bytes(range(256)), 422, "corrupt_file"),
        "bomb.docx": (
            make.docx_zip_bomb(tmp_path / "b.docx", 4 * 1_048_576).read_bytes(),
            422,
            "zip_bomb",
        ),
        "latin1.txt": ("Caf\xe9".encode("latin-1"), 422, "undecodable"),
        "blank.md": (b"  \n", 422, "blank"),
        "long.txt": (b"word " * 60_000, 413, "too_large"),  # 300 KB of text: over 256 KiB
    }
    for name, (data, status, code) in cases.items():
        response = await api.post("/v1/documents", files={"file": (name, data)})
        assert response.status_code == status, (name, response.text)
        assert response.json()["error"]["code"] == code, name
        assert response.json()["error"]["message"], name
    assert await count(db) == 0


async def test_an_upload_over_the_limit_is_refused_before_it_is_read(
    api: httpx.AsyncClient, db: AsyncEngine
) -> None:
    big = b"%PDF-1.7\n" + bytes(DOCUMENT_MAX_BYTES + 100_000)
    response = await api.post("/v1/documents", files={"file": ("big.pdf", big)})
    assert response.status_code == 413, response.text
    assert response.json()["error"]["code"] == "payload_too_large"
    just_over = b"%PDF-1.7\n" + bytes(DOCUMENT_MAX_BYTES)  # the body is within its limit
    response = await api.post("/v1/documents", files={"file": ("big.pdf", just_over)})
    assert response.status_code == 413, response.text
    assert response.json()["error"]["code"] == "too_large"
    assert await count(db) == 0


async def test_the_form_is_checked_as_a_job_s_body_is(
    api: httpx.AsyncClient, db: AsyncEngine
) -> None:
    note = {"file": ("note.md", b"# Note\n\nThe gate opens at dawn.\n")}
    cases = {
        "unknown_priority": {"priority": "urgent"},
        "invalid_request": {"max_tokens": "many"},
        "deadline_in_past": {"deadline": "2001-01-01T00:00:00Z"},
        "model_not_found": {"model": "no-such-model"},
    }
    for code, form in cases.items():
        response = await api.post("/v1/documents", files=note, data=form)
        assert response.json()["error"]["code"] == code, response.text
    both = await api.post(
        "/v1/documents", files=note, data={"ttl_s": "60", "deadline": "2999-01-01T00:00:00Z"}
    )
    assert both.status_code == 422
    missing = await api.post("/v1/documents", data={"max_tokens": "8"})
    assert missing.status_code == 422
    assert await count(db) == 0
