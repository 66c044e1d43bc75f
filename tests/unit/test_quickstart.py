"""docs/quickstart.md names only API routes the app serves and settings it defines."""

from __future__ import annotations

import re
from pathlib import Path

from plumbing.settings import Settings
from producers.api.app import create_app

QUICKSTART = Path(__file__).resolve().parents[2] / "docs" / "quickstart.md"


def _routes() -> set[tuple[str, str]]:
    app = create_app(Settings(database_url="postgresql+asyncpg://x@127.0.0.1/x"))
    return {
        (method.upper(), re.sub(r"\{[^}]+\}", "{}", path))
        for path, operations in app.openapi()["paths"].items()
        for method in operations
    }


def test_every_curl_in_the_quickstart_is_a_route() -> None:
    text = QUICKSTART.read_text()
    calls = re.findall(r"curl -s (?:-X (\w+) )?\"?\$API(/v1/[\w/.-]+)", text)
    assert len(calls) >= 7
    routes = _routes()
    for method, path in calls:
        shape = re.sub(r"/(01a2[\w.-]+|msg_\w+)", "/{}", path)
        assert (method or "GET", shape) in routes, (method, path)


def test_the_settings_it_names_exist() -> None:
    for name in re.findall(r"SLUICEGATE_(\w+)=", QUICKSTART.read_text()):
        assert name.lower() in Settings.model_fields, name
