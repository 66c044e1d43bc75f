"""The document route: ``POST /v1/documents`` takes a file as people keep it (PDF, Word,
HTML, Markdown, reStructuredText, text; multipart), reads its text (``plumbing.documents``,
docs/documents.md) and submits it as a ``summarize`` job through ``POST /v1/jobs``' own
path: the same checks, the same admission, the same answer.

Reading a document is CPU work of up to seconds: it runs in threads, at most
``document_extractions`` at once, and an upload that finds them all busy is refused at
once (503 ``documents_busy``), never queued."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime
from functools import partial
from typing import Annotated, Any

from fastapi import APIRouter, Form, Header, Request, UploadFile
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from plumbing.documents.errors import UnreadableDocument
from plumbing.documents.extract import SUFFIXES, extract, kind_of, unsupported
from plumbing.documents.limits import DocumentLimits, size_text
from plumbing.settings import Settings
from producers.api import openapi
from producers.api.deps import Tenant
from producers.api.jobs import submitted
from schemas import constants
from schemas.api import SubmitJob, SubmitResponse
from schemas.errors import SluicegateError
from schemas.jobs import JobKind, Priority

_ERRORS = openapi.errors(400, 401, 404, 408, 409, 413, 415, 422, 429, 503)

router = APIRouter()


class DocumentsBusy(SluicegateError):
    """Every document reader of the API is busy (`document_extractions` at once); nothing
    was stored: retry after Retry-After."""

    code = "documents_busy"
    status = 503
    retriable = True


# A document's text from its bytes and name, under limits (``plumbing.documents``' extract).
Read = Callable[[bytes, str, DocumentLimits], str]


class Extractor:
    """Reads documents in threads with ``read``, at most ``at_once`` at a time, under
    ``limits``. A read holds its place until its thread is done, even when its request has
    gone."""

    def __init__(self, limits: DocumentLimits, *, at_once: int, read: Read = extract) -> None:
        self.limits = limits
        self._at_once = at_once
        self._read = read
        self._running = 0

    @classmethod
    def of(cls, settings: Settings) -> Extractor:
        """The API's reader: the documents' limits, and the text's (``max_input_bytes``)."""
        limits = settings.documents.limits(max_text_bytes=settings.max_input_bytes)
        return cls(limits, at_once=settings.document_extractions)

    async def text(self, data: bytes, name: str) -> str:
        if self._running >= self._at_once:
            raise DocumentsBusy(
                f"the API is reading {self._at_once} documents already; try again shortly"
            )
        self._running += 1
        loop = asyncio.get_running_loop()
        work = loop.run_in_executor(None, partial(self._read, data, name, self.limits))
        work.add_done_callback(self._release)
        # A request that goes away leaves its thread to finish (a thread cannot be
        # stopped), still counted.
        return await asyncio.shield(work)

    def _release(self, _: object) -> None:
        self._running -= 1


class SubmitDocument(BaseModel):
    """POST /v1/documents (multipart/form-data): the document, and the fields of a
    `POST /v1/jobs` body that a summary takes."""

    model_config = ConfigDict(extra="forbid")

    file: UploadFile = Field(description="The document; its filename's suffix says its kind")
    max_tokens: int = Field(default=256, ge=1, description="Most output tokens")
    ttl_s: float | None = Field(default=None, gt=0, description="The deadline as seconds from now")
    deadline: datetime | None = Field(default=None, description="RFC 3339, with an offset")
    priority: Priority = Priority.NORMAL
    callback_url: str | None = Field(default=None, max_length=2048)
    idempotency_key: str | None = Field(
        default=None,
        min_length=1,
        max_length=255,
        description="As the Idempotency-Key header (if both, they must match)",
    )
    model: str | None = Field(default=None, min_length=1, max_length=256)


@router.post(
    "/v1/documents",
    status_code=202,
    response_model=SubmitResponse,
    summary="Submit a document to summarize",
    description="A file (multipart field `file`; its kind by its filename's suffix: "
    f"{', '.join(SUFFIXES)}) is read into text (docs/documents.md) and submitted as a "
    "`summarize` job, as `POST /v1/jobs` submits one: 202 once it is committed, 200 for an "
    "idempotent replay, or a refusal with Retry-After. A file that cannot be read is a "
    "4xx with the reason's code (`unsupported_format` 415, `encrypted_pdf`, `no_text_layer`, "
    "`corrupt_file`, ...); 503 `documents_busy` when every reader is busy.",
    responses={
        202: {
            "headers": openapi.headers(
                "Location", constants.HEADER_IDEMPOTENT_REPLAY, "Retry-After"
            )
        },
        200: {
            "model": SubmitResponse,
            "description": "An idempotent replay",
            "headers": openapi.headers("Location", constants.HEADER_IDEMPOTENT_REPLAY),
        },
        **_ERRORS,
    },
)
async def submit_document(
    form: Annotated[SubmitDocument, Form(media_type="multipart/form-data")],
    request: Request,
    tenant: Tenant,
    idempotency_key: Annotated[
        str | None, Header(alias=constants.HEADER_IDEMPOTENCY_KEY, max_length=255)
    ] = None,
) -> Response:
    extractor: Extractor = request.app.state.documents
    name = form.file.filename or ""
    text = await extractor.text(await _bytes(form.file, name, extractor.limits), name)
    body = _job({"kind": JobKind.SUMMARIZE, "input": text, **form.model_dump(exclude={"file"})})
    return await submitted(request.app.state, body, tenant, idempotency_key, None, request.receive)


async def _bytes(file: UploadFile, name: str, limits: DocumentLimits) -> bytes:
    """The upload's bytes, once its name says a kind that is read and its size is within
    the limit (the upload lies spooled on disk till then)."""
    if kind_of(name) is None:
        raise unsupported(name)
    if file.size is not None and file.size > limits.max_bytes:
        raise UnreadableDocument(
            "too_large",
            f"the file is {file.size:,} bytes, over the limit of {size_text(limits.max_bytes)} "
            "per file",
        )
    try:
        return await file.read()
    finally:
        await file.close()


def _job(fields: dict[str, Any]) -> SubmitJob:
    """The job's body, as ``POST /v1/jobs`` would have had it (its errors as that route's)."""
    try:
        return SubmitJob.model_validate(
            {name: value for name, value in fields.items() if value is not None}
        )
    except ValidationError as exc:
        raise RequestValidationError(
            [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)]
        ) from None
