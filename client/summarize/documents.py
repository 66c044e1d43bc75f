"""Documents read from a folder as a user has it: each file is read, or skipped with its name
and the reason, never a traceback and never a guess.

Text is UTF-8 (a byte-order mark is dropped) or UTF-16 with its byte-order mark; any other
bytes are skipped as ``undecodable`` unless an ``encoding`` is given for the folder
(``--encoding cp1252``), because a wrong guess would be summarized as garbage without a word.
The encoding is for those files only: a file that is valid UTF-8, or UTF-16 with a BOM, is
read as that whatever ``encoding`` says.

Only ``.txt`` and ``.md`` files are read; the others under the folder (``README``, ``.json``,
``.rst``...) are passed over, and named in ``Folder.passed_over`` so the run can say so.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

DOCUMENT_SUFFIXES = frozenset({".txt", ".md"})
BINARY = "holds NUL bytes: a binary file, not text"


@dataclass(frozen=True)
class Document:
    name: str  # the path under the folder, with forward slashes
    text: str


@dataclass(frozen=True)
class Skipped:
    """A file that is not part of the batch: ``reason`` is a stable code (``undecodable``,
    ``binary``, ``empty``, ``blank``, ``too_large``, ``unreadable``), ``message`` says why."""

    name: str
    reason: str
    message: str


@dataclass(frozen=True)
class Folder:
    documents: list[Document]
    skipped: list[Skipped]
    passed_over: list[str] = field(default_factory=list)  # files of other kinds, not read


def suffixes_text(joiner: str = " or ") -> str:
    """``.txt or .md``: the kinds of file read, for messages."""
    return joiner.join(sorted(DOCUMENT_SUFFIXES, reverse=True))


def passed_over_in(directory: Path) -> list[str]:
    """The files under ``directory`` that are not read (not .txt or .md), by their path
    under it."""
    return sorted(
        p.relative_to(directory).as_posix()
        for p in directory.rglob("*")
        if p.suffix.lower() not in DOCUMENT_SUFFIXES and p.is_file()
    )


def files_in(directory: Path) -> list[Path]:
    """Every *.txt and *.md file under ``directory`` (hidden ones included), in a stable
    order."""
    return sorted(
        p for p in directory.rglob("*") if p.suffix.lower() in DOCUMENT_SUFFIXES and p.is_file()
    )


def read_folder(directory: Path, *, max_bytes: int, encoding: str | None = None) -> Folder:
    folder = _folder(
        read_document(path, path.relative_to(directory).as_posix(), max_bytes, encoding)
        for path in files_in(directory)
    )
    return Folder(folder.documents, folder.skipped, passed_over_in(directory))


def read_path(path: Path, name: str, *, max_bytes: int, encoding: str | None = None) -> Folder:
    """A folder's documents, or one file (called ``name``) as a folder of one."""
    if path.is_dir():
        return read_folder(path, max_bytes=max_bytes, encoding=encoding)
    return _folder([read_document(path, name, max_bytes, encoding)])


def _folder(found: Iterable[Document | Skipped]) -> Folder:
    documents: list[Document] = []
    skipped: list[Skipped] = []
    for item in found:
        if isinstance(item, Document):
            documents.append(item)
        else:
            skipped.append(item)
    return Folder(documents, skipped)


def read_document(
    path: Path, name: str, max_bytes: int, encoding: str | None = None
) -> Document | Skipped:
    """One file as a document, or why it is not one. ``max_bytes`` bounds the text as the
    API counts it (UTF-8 bytes)."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        return Skipped(name, "unreadable", f"cannot be read: {exc.strerror or exc}")
    if not data:
        return Skipped(name, "empty", "the file is empty")
    utf16 = data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE))
    if b"\x00" in data and not utf16 and encoding is None:
        return Skipped(name, "binary", BINARY)
    try:
        text = decode(data, encoding)
    except UnicodeDecodeError as exc:
        return Skipped(name, "undecodable", _undecodable(exc, encoding))
    if "\x00" in text:
        return Skipped(name, "binary", BINARY)
    if not text.strip():
        return Skipped(name, "blank", "holds only whitespace")
    size = len(text.encode("utf-8"))
    if size > max_bytes:
        return Skipped(
            name,
            "too_large",
            f"{size:,} bytes of text, over the limit of {max_bytes:,} ({_kib(max_bytes)}) "
            "per document",
        )
    return Document(name, text)


def decode(data: bytes, encoding: str | None = None) -> str:
    """The text of a file: UTF-16 when it starts with its BOM, else UTF-8 when it is valid
    UTF-8, else in ``encoding`` (if one is given). UnicodeDecodeError when none fits."""
    own = "utf-16" if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)) else "utf-8-sig"
    try:
        text = data.decode(own)
    except UnicodeDecodeError:
        if encoding is None:
            raise
        return data.decode(encoding)
    if encoding is not None and own != "utf-16" and "\x00" in text:
        return data.decode(encoding)  # NUL bytes: a wide encoding without its BOM (utf-16-le)
    return text


def _undecodable(exc: UnicodeDecodeError, encoding: str | None) -> str:
    bad = exc.object[exc.start : exc.start + 1].hex()
    if encoding is not None:
        return f"not {encoding}: byte 0x{bad} at offset {exc.start}"
    return (
        f"not UTF-8: byte 0x{bad} at offset {exc.start} "
        "(give --encoding, e.g. cp1252, if the folder is in another encoding)"
    )


def _kib(size: int) -> str:
    return f"{size / 1024:,.0f} KiB" if size >= 1024 else f"{size} bytes"
