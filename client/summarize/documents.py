"""Documents read from a folder as a user has it: each file is read, or skipped with its name
and the reason, never a traceback and never a guess.

Text is UTF-8 (a byte-order mark is dropped) or UTF-16 with its byte-order mark; any other
bytes are skipped as ``undecodable`` unless an ``encoding`` is given for the whole folder
(``--encoding cp1252``), because a wrong guess would be summarized as garbage without a word.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable
from dataclasses import dataclass
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


def files_in(directory: Path) -> list[Path]:
    """Every *.txt and *.md file under ``directory`` (hidden ones included), in a stable
    order."""
    return sorted(
        p for p in directory.rglob("*") if p.suffix.lower() in DOCUMENT_SUFFIXES and p.is_file()
    )


def read_folder(directory: Path, *, max_bytes: int, encoding: str | None = None) -> Folder:
    return _folder(
        read_document(path, path.relative_to(directory).as_posix(), max_bytes, encoding)
        for path in files_in(directory)
    )


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
    """The text of a file: in ``encoding`` if one is given, else UTF-8 or BOM-marked UTF-16."""
    if encoding is not None:
        return data.decode(encoding)
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return data.decode("utf-16")
    return data.decode("utf-8-sig")


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
