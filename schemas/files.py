"""Uploaded files in the shape of OpenAI's Files API: the file object, the list, the
deletion, and the errors of an upload."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, Field

from schemas.errors import SluicegateError

FILE_ID_PREFIX = "file-"
# The purposes an upload may name: Sluicegate runs batches only (``batch_output`` files
# are the ones a batch produces, never uploaded: its output and error files).
UPLOAD_PURPOSES = ("batch",)
Order = Literal["asc", "desc"]


class FileNotFound(SluicegateError):
    """No such file for this tenant (another tenant's file answers this too)."""

    code = "file_not_found"
    status = 404


class UnsupportedPurpose(SluicegateError):
    """The upload's ``purpose`` is not ``batch``: the only files Sluicegate takes are
    OpenAI Batch input."""

    code = "unsupported_purpose"
    status = 400


class FileObject(BaseModel):
    """OpenAI's file object; times are Unix seconds as there."""

    id: str
    object: Literal["file"] = "file"
    bytes: int = Field(description="The file's size in bytes")
    created_at: int
    filename: str
    purpose: str
    status: Literal["processed"] = "processed"
    expires_at: int | None = None
    status_details: str | None = None


class FileList(BaseModel):
    """OpenAI's list of files: ask again with ``after=last_id`` while ``has_more``."""

    object: Literal["list"] = "list"
    data: list[FileObject]
    first_id: str | None
    last_id: str | None
    has_more: bool


class FileDeleted(BaseModel):
    id: str
    object: Literal["file"] = "file"
    deleted: bool = True


def file_from_row(row: Mapping[Any, Any]) -> FileObject:
    """The file object of a ``files`` row."""
    return FileObject(
        id=row["id"],
        bytes=row["bytes"],
        created_at=int(row["created_at"].timestamp()),
        filename=row["filename"],
        purpose=row["purpose"],
    )
