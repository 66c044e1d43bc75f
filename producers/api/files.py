"""The file routes, as OpenAI's Files API: upload a batch's input file (multipart:
``file`` and ``purpose``), list, read, read the content of, and delete the caller's files.
Everything is scoped to the caller's tenant; another tenant's file answers 404."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.datastructures import FormData, UploadFile
from starlette.exceptions import HTTPException

from producers.api import openapi
from producers.api.deps import AppSettings, Files, Tenant
from producers.files.checks import UploadCheck
from producers.files.repository import PART_BYTES
from schemas.batches import InvalidMultipart
from schemas.errors import InvalidRequest
from schemas.files import (
    UPLOAD_PURPOSES,
    FileDeleted,
    FileList,
    FileObject,
    Order,
    UnsupportedPurpose,
)

MAX_PAGE = 10_000  # OpenAI's largest (and default) page of files
MAX_FILENAME = 255
OCTET_STREAM = "application/octet-stream"
_ERRORS = openapi.errors(400, 401, 404, 408, 413, 422, 503)
_REQUEST_BODY = {
    "required": True,
    "content": {
        "multipart/form-data": {
            "schema": {
                "type": "object",
                "required": ["file", "purpose"],
                "properties": {
                    "file": {"type": "string", "format": "binary"},
                    "purpose": {"type": "string", "enum": list(UPLOAD_PURPOSES)},
                },
            }
        }
    },
}

router = APIRouter(prefix="/v1/files", tags=["files"], responses=_ERRORS)


async def _form(request: Request) -> FormData:
    try:
        # The file spools to a temporary file on disk past 1 MiB: never whole in memory.
        return await request.form(max_files=1, max_fields=8)
    except HTTPException as exc:
        if exc.status_code != 400:  # a body over its limit, or too slow
            raise
        raise InvalidMultipart(f"the multipart body cannot be read: {exc.detail}") from None


def _purpose(value: object) -> str:
    if not isinstance(value, str):
        raise InvalidRequest("the upload has no purpose field")
    if value == "batch_output":
        raise UnsupportedPurpose("batch_output files are made by batches, not uploaded")
    if value not in UPLOAD_PURPOSES:
        raise UnsupportedPurpose(
            f"purpose {value!r} is not supported: Sluicegate takes batch input files "
            "(purpose batch) only"
        )
    return value


@router.post(
    "",
    status_code=201,
    response_model=FileObject,
    summary="Upload a file (OpenAI Batch input, purpose batch)",
    responses={201: {"headers": openapi.headers("Location")}},
    openapi_extra={"requestBody": _REQUEST_BODY},
)
async def create_file(
    request: Request, tenant: Tenant, settings: AppSettings, store: Files
) -> JSONResponse:
    """Any file of at most ``max_file_lines`` non-blank lines in at most ``max_file_bytes``
    (else 413, nothing stored): as in OpenAI's Batch API, its lines are checked in the
    batch made from it, which is ``failed`` with the bad lines in ``errors.data``."""
    form = await _form(request)
    try:
        purpose = _purpose(form.get("purpose"))
        upload = form.get("file")
        if not isinstance(upload, UploadFile):
            raise InvalidRequest("the upload has no file field")
        filename = upload.filename or "file"
        if len(filename) > MAX_FILENAME:
            raise InvalidRequest(f"the filename is over {MAX_FILENAME} characters")
        check = UploadCheck(max_bytes=settings.max_file_bytes, max_lines=settings.max_file_lines)

        async def chunks() -> AsyncIterator[bytes]:
            while chunk := await upload.read(PART_BYTES):
                check.feed(chunk)
                yield chunk
            check.finish()

        created = await store.create(tenant, filename, purpose, chunks())
    finally:
        await form.close()
    return JSONResponse(
        created.model_dump(mode="json"),
        status_code=201,
        headers={"Location": f"/v1/files/{created.id}"},
    )


@router.get("", response_model=FileList, summary="List the caller's files")
async def list_files(
    store: Files,
    tenant: Tenant,
    after: Annotated[str | None, Query(max_length=64, description="last_id of a page")] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = MAX_PAGE,
    order: Annotated[Order, Query(description="by created_at")] = "desc",
    purpose: Annotated[str | None, Query(max_length=64)] = None,
) -> FileList:
    """The caller's files by creation time, newest first unless ``order=asc``: uploads
    (purpose ``batch``) and the batches' output and error files (``batch_output``)."""
    page, more = await store.list(tenant, purpose=purpose, after=after, limit=limit, order=order)
    return FileList(
        data=page,
        first_id=page[0].id if page else None,
        last_id=page[-1].id if page else None,
        has_more=more,
    )


@router.get("/{file_id}", response_model=FileObject, summary="Read a file's object")
async def get_file(file_id: str, store: Files, tenant: Tenant) -> FileObject:
    """An uploaded file, or a batch's output or error file (purpose ``batch_output``),
    written while the batch was ``finalizing``."""
    return await store.get(tenant, file_id)


@router.get(
    "/{file_id}/content",
    summary="Read a file's content",
    response_class=StreamingResponse,
    responses={200: {"content": {OCTET_STREAM: {}}, "description": "The file as uploaded"}},
)
async def file_content(file_id: str, store: Files, tenant: Tenant) -> StreamingResponse:
    """The file's bytes as uploaded, streamed a part (about 1 MiB) at a time; a batch's
    output or error file holds OpenAI Batch output lines in submission order."""
    parts = store.content(tenant, file_id)
    first = await anext(parts, b"")  # 404 before the stream starts

    async def body() -> AsyncIterator[bytes]:
        try:
            if first:
                yield first
            async for part in parts:
                yield part
        finally:
            await parts.aclose()

    return StreamingResponse(body(), media_type=OCTET_STREAM)


@router.delete("/{file_id}", response_model=FileDeleted, summary="Delete a file")
async def delete_file(file_id: str, store: Files, tenant: Tenant) -> FileDeleted:
    """The file and its content are gone; batches made from it are kept."""
    await store.delete(tenant, file_id)
    return FileDeleted(id=file_id)
