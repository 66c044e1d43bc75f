"""Documents read from a folder as a user has it: each file is read, or skipped with its name
and the reason, never a traceback and never a guess.

PDF, Word (.docx), HTML, Markdown, reStructuredText and text files are read, by
``plumbing.documents`` (its rules, limits and reasons: docs/documents.md). Text is UTF-8 (a
byte-order mark is dropped) or UTF-16 with its byte-order mark; any other bytes are skipped
as ``undecodable`` unless an ``encoding`` is given for the folder (``--encoding cp1252``),
because a wrong guess would be summarized as garbage without a word. The encoding is for
those files only: a file that is valid UTF-8, or UTF-16 with a BOM, is read as that whatever
``encoding`` says.

The other files under the folder (``README``, ``.json``...) are passed over, and named in
``Folder.passed_over`` so the run can say so and list them with the skipped ones.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from plumbing.documents.errors import UnreadableDocument
from plumbing.documents.extract import SUFFIXES, extract, unsupported
from plumbing.documents.limits import DocumentLimits, size_text

DOCUMENT_SUFFIXES = frozenset(SUFFIXES)
ENCODING_HINT = " (give --encoding, e.g. cp1252, if the folder is in another encoding)"


@dataclass(frozen=True)
class FolderDocument:
    name: str  # the path under the folder, with forward slashes
    text: str


@dataclass(frozen=True)
class Skipped:
    """A file that is not part of the batch: ``reason`` is a stable code (those of
    ``plumbing.documents.errors.REASONS``, and ``unreadable``), ``message`` says why."""

    name: str
    reason: str
    message: str


@dataclass(frozen=True)
class Folder:
    documents: list[FolderDocument]
    skipped: list[Skipped]
    passed_over: list[str] = field(default_factory=list)  # files of other kinds, not read


def passed_over_in(directory: Path) -> list[str]:
    """The files under ``directory`` that are not read (not of a kind that is), by their
    path under it."""
    return sorted(
        p.relative_to(directory).as_posix()
        for p in directory.rglob("*")
        if p.suffix.lower() not in DOCUMENT_SUFFIXES and p.is_file()
    )


def not_read(names: Iterable[str]) -> list[Skipped]:
    """The files passed over, each as skipped for its kind (``unsupported_format``)."""
    return [Skipped(name, "unsupported_format", unsupported(name).message) for name in names]


def files_in(directory: Path) -> list[Path]:
    """Every file of a kind that is read under ``directory`` (hidden ones included), in a
    stable order."""
    return sorted(
        p for p in directory.rglob("*") if p.suffix.lower() in DOCUMENT_SUFFIXES and p.is_file()
    )


def read_folder(
    directory: Path,
    *,
    max_bytes: int,
    encoding: str | None = None,
    limits: DocumentLimits | None = None,
) -> Folder:
    folder = _folder(
        read_document(path, path.relative_to(directory).as_posix(), max_bytes, encoding, limits)
        for path in files_in(directory)
    )
    return Folder(folder.documents, folder.skipped, passed_over_in(directory))


def read_path(
    path: Path,
    name: str,
    *,
    max_bytes: int,
    encoding: str | None = None,
    limits: DocumentLimits | None = None,
) -> Folder:
    """A folder's documents, or one file (called ``name``) as a folder of one."""
    if path.is_dir():
        return read_folder(path, max_bytes=max_bytes, encoding=encoding, limits=limits)
    return _folder([read_document(path, name, max_bytes, encoding, limits)])


def _folder(found: Iterable[FolderDocument | Skipped]) -> Folder:
    documents: list[FolderDocument] = []
    skipped: list[Skipped] = []
    for item in found:
        if isinstance(item, FolderDocument):
            documents.append(item)
        else:
            skipped.append(item)
    return Folder(documents, skipped)


def read_document(
    path: Path,
    name: str,
    max_bytes: int,
    encoding: str | None = None,
    limits: DocumentLimits | None = None,
) -> FolderDocument | Skipped:
    """One file as a document, or why it is not one. ``max_bytes`` bounds the text as the
    API counts it (UTF-8 bytes); ``limits`` the file (the defaults of the settings group
    ``documents`` when None)."""
    limits = replace(limits or DocumentLimits(), max_text_bytes=max_bytes)
    try:
        size = path.stat().st_size
        if size > limits.max_bytes:  # not read at all
            return Skipped(
                name,
                "too_large",
                f"the file is {size:,} bytes, over the limit of {size_text(limits.max_bytes)} "
                "per file",
            )
        data = path.read_bytes()
    except OSError as exc:
        return Skipped(name, "unreadable", f"cannot be read: {exc.strerror or exc}")
    try:
        return FolderDocument(name, extract(data, name, limits, encoding=encoding))
    except UnreadableDocument as exc:
        hint = ENCODING_HINT if exc.code == "undecodable" and encoding is None else ""
        return Skipped(name, exc.code, exc.message + hint)
