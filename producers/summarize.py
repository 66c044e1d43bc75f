"""`sluicegate summarize`: documents (a directory, or an OpenAI Batch JSONL file) sent as one
batch, followed with a live progress bar, results written as they finish.

An interrupted run resumes: the batch id is kept beside the results file (``<out>.batch``),
so a second run with the same input and ``--out`` submits nothing and only writes the
results not written yet. The batch is also submitted with an Idempotency-Key derived from
the input, so even without that file the same input never becomes a second batch.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DOCUMENT_SUFFIXES = {".txt", ".md"}
SUMMARIZE_URL = "/v1/summarize"


class InputError(Exception):
    """The input cannot become a batch; the message says why."""


def documents(directory: Path) -> list[Path]:
    """Every *.txt and *.md file under ``directory``, in a stable order."""
    return sorted(
        p for p in directory.rglob("*") if p.is_file() and p.suffix.lower() in DOCUMENT_SUFFIXES
    )


def build_requests(path: Path, *, max_tokens: int) -> list[dict[str, Any]]:
    """The batch's requests: one summarize request per document (its custom_id is the path
    under the directory), or the lines of a JSONL file as they are."""
    if path.is_dir():
        found = documents(path)
        if not found:
            raise InputError(f"no .txt or .md files under {path}")
        return [
            {
                "custom_id": doc.relative_to(path).as_posix(),
                "method": "POST",
                "url": SUMMARIZE_URL,
                "body": {"input": doc.read_text(encoding="utf-8"), "max_tokens": max_tokens},
            }
            for doc in found
        ]
    if not path.is_file():
        raise InputError(f"{path} is neither a directory nor a file")
    requests = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            request = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"{path}:{number}: not JSON ({exc.msg})") from None
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
    """What a results file's run is: its batch and the fingerprint of its input."""

    batch_id: str
    digest: str

    @staticmethod
    def path(out: Path) -> Path:
        return out.with_name(out.name + ".batch")

    @classmethod
    def load(cls, out: Path) -> Resume | None:
        path = cls.path(out)
        if not path.exists():
            return None
        data = json.loads(path.read_text())
        return cls(batch_id=str(data["batch_id"]), digest=str(data["digest"]))

    def save(self, out: Path) -> None:
        self.path(out).write_text(json.dumps({"batch_id": self.batch_id, "digest": self.digest}))


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
    for line in data[:end].splitlines():
        if line.strip():
            result = json.loads(line)
            seen.add(str(result["custom_id"]))
            last = str(result["sluicegate"]["job_id"])
    return Written(frozenset(seen), last)
