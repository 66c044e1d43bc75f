"""`sluicegate summarize`: what becomes the batch (a folder's documents, or an OpenAI Batch
JSONL file), and what a results file already holds.

An interrupted run resumes: the batch is recorded beside the results file (``<out>.batch``:
its id, the fingerprint of its input, when it was made and its absolute deadline), so a
second run with the same input and ``--out`` submits nothing and only writes the results not
written yet. The batch is also submitted with an Idempotency-Key derived from the input, so
the same input never becomes a second batch unless ``--new`` asks for one.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from client.summarize.documents import (
    DOCUMENT_SUFFIXES,
    Folder,
    Skipped,
    not_read,
    read_path,
)
from plumbing.documents.extract import KINDS_TEXT
from plumbing.documents.limits import DocumentLimits
from plumbing.documents.text import decode
from schemas.sampling import SummaryOptions

SUMMARIZE_URL = "/v1/summarize"


class InputError(Exception):
    """The input cannot become a batch; the message says why."""


@dataclass(frozen=True)
class Input:
    """The batch's request lines, and the files that are not part of it (with why)."""

    requests: list[dict[str, Any]]
    skipped: list[Skipped] = field(default_factory=list)
    passed_over: list[str] = field(default_factory=list)  # files of other kinds, not read

    def not_summarized(self) -> list[Skipped]:
        """Every file that is not part of the batch, by name: the skipped ones and those
        passed over (``unsupported_format``)."""
        return sorted([*self.skipped, *not_read(self.passed_over)], key=lambda s: s.name)


def build_requests(
    path: Path,
    *,
    max_tokens: int,
    max_bytes: int,
    encoding: str | None = None,
    limits: DocumentLimits | None = None,
    summary: SummaryOptions | None = None,
) -> Input:
    """One summarize request per readable document of a folder (its custom_id is the path
    under the folder) or of one document file, each asking for ``summary`` when given, or the
    lines of a JSONL file as they are."""
    asked = summary.stored() if summary is not None else None
    if of_documents(path):
        folder = _read(path, max_bytes, encoding, limits)
        body: dict[str, Any] = {"max_tokens": max_tokens}
        if asked is not None:
            body["summary"] = asked
        requests = [
            {
                "custom_id": doc.name,
                "method": "POST",
                "url": SUMMARIZE_URL,
                "body": {"input": doc.text, **body},
            }
            for doc in folder.documents
        ]
        return Input(requests, folder.skipped, folder.passed_over)
    if not path.exists():
        raise InputError(f"{path} does not exist")
    if not path.is_file():
        raise InputError(f"{path} is neither a directory nor a file")
    if asked is not None:
        raise InputError(
            f"--style, --instructions, --language and --words are for documents; {path}'s "
            "lines ask for their own summary (body.summary)"
        )
    return Input(_jsonl_requests(path, encoding))


def of_documents(path: Path) -> bool:
    """Whether ``path`` is documents to summarize (a folder, or one document file), not a
    JSONL file of request lines."""
    return path.is_dir() or (path.is_file() and path.suffix.lower() in DOCUMENT_SUFFIXES)


def _read(
    path: Path, max_bytes: int, encoding: str | None, limits: DocumentLimits | None
) -> Folder:
    folder = read_path(path, path.name, max_bytes=max_bytes, encoding=encoding, limits=limits)
    if not folder.documents and not folder.skipped:
        others = folder.passed_over
        said = f"; passed over {passed_over_text(others)}" if others else ""
        raise InputError(f"no documents under {path}: only {KINDS_TEXT} are read{said}")
    return folder


def passed_over_text(names: list[str], examples: int = 3) -> str:
    """``3 other files (README, data.json, notes.rst)``, or ``12 other files (a, b, c, ...)``."""
    shown = ", ".join(names[:examples]) + (", ..." if len(names) > examples else "")
    return f"{len(names):,} other file{'s' if len(names) != 1 else ''} ({shown})"


def _jsonl_requests(path: Path, encoding: str | None) -> list[dict[str, Any]]:
    try:
        text = decode(path.read_bytes(), encoding)
    except OSError as exc:
        raise InputError(f"{path} cannot be read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        number = exc.object[: exc.start].count(b"\n") + 1
        raise InputError(
            f"{path}:{number}: not {encoding or 'UTF-8'} (byte 0x{exc.object[exc.start]:02x} at "
            f"offset {exc.start})"
        ) from None
    requests = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            request = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as exc:
            reason = exc.msg if isinstance(exc, json.JSONDecodeError) else "nested too deeply"
            raise InputError(f"{path}:{number}: not JSON ({reason})") from None
        if not isinstance(request, dict) or "custom_id" not in request:
            raise InputError(f"{path}:{number}: not a batch request (no custom_id)")
        requests.append(request)
    if not requests:
        raise InputError(f"{path} has no requests")
    return requests


def digest(requests: list[dict[str, Any]], completion_window: str) -> str:
    """A fingerprint of what is submitted: the same input gives the same batch."""
    canonical = json.dumps([requests, completion_window], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass(frozen=True)
class Resume:
    """What a results file's run is: its batch, the fingerprint of its input, and (ISO 8601)
    when the batch was made and its deadline."""

    batch_id: str
    digest: str
    created_at: str | None = None
    deadline: str | None = None
    new: bool = False  # made by a --new run: the same command resumes it until it has ended

    @staticmethod
    def path(out: Path) -> Path:
        return out.with_name(out.name + ".batch")

    @classmethod
    def load(cls, out: Path) -> Resume | None:
        path = cls.path(out)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            return cls(
                batch_id=str(data["batch_id"]),
                digest=str(data["digest"]),
                created_at=data.get("created_at"),
                deadline=data.get("deadline"),
                new=bool(data.get("new", False)),
            )
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError):
            raise InputError(
                f"{path} is damaged; remove it (and {out}) to start the batch again"
            ) from None

    def save(self, out: Path) -> None:
        self.path(out).write_text(json.dumps(asdict(self)), encoding="utf-8")

    def deadline_at(self) -> datetime | None:
        return datetime.fromisoformat(self.deadline) if self.deadline else None


@dataclass(frozen=True)
class Written:
    """What a results file holds already: its requests' custom_ids, and the job of its
    last line (where the results endpoint goes on from)."""

    custom_ids: frozenset[str]
    last_job_id: str | None


def written(out: Path) -> Written:
    """What ``out`` holds. A last line cut short by an interruption is removed, so it is
    written again whole."""
    if not out.exists():
        return Written(frozenset(), None)
    data = out.read_bytes()
    end = data.rfind(b"\n") + 1
    if end < len(data):
        with out.open("r+b") as f:
            f.truncate(end)
    seen = set()
    last = None
    for number, line in enumerate(data[:end].splitlines(), start=1):
        if not line.strip():
            continue
        try:
            result = json.loads(line)
            seen.add(str(result["custom_id"]))
            last = str(result["sluicegate"]["job_id"])
        except (ValueError, KeyError, TypeError):
            raise InputError(
                f"{out}:{number} is not a result line of sluicegate summarize; choose another --out"
            ) from None
    return Written(frozenset(seen), last)


def skipped_path(out: Path) -> Path:
    """Where the files left out of the batch are listed: ``results.skipped.jsonl``."""
    return out.with_name(f"{out.stem}.skipped{out.suffix or '.jsonl'}")


def write_skipped(out: Path, skipped: list[Skipped]) -> Path | None:
    """List the skipped files in OpenAI's error-line shape; removes a stale list."""
    path = skipped_path(out)
    if not skipped:
        path.unlink(missing_ok=True)
        return None
    lines = (
        json.dumps(
            {"custom_id": s.name, "error": {"code": s.reason, "message": s.message}},
            ensure_ascii=False,
        )
        + "\n"
        for s in skipped
    )
    path.write_text("".join(lines), encoding="utf-8")
    return path
