"""The sample documents bundled with Sluicegate, used by ``sluicegate demo`` and the tests.

They are original, fictional or general-knowledge texts written for this project.
"""

from __future__ import annotations

from importlib.resources import files


def sample_documents() -> list[tuple[str, str]]:
    """The bundled documents as (file name, text) pairs, sorted by file name."""
    folder = files(__name__)
    documents = [
        (entry.name, entry.read_text(encoding="utf-8"))
        for entry in folder.iterdir()
        if entry.is_file() and entry.name.endswith(".txt")
    ]
    return sorted(documents)
