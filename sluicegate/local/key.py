"""The local stack's own API key: made once for the default tenant, kept in the data
directory (mode 0600) so `up`, `demo`, `submit` and `summarize` share it across restarts."""

from __future__ import annotations

import os
from pathlib import Path

from plumbing.settings import Settings

FILE = "api_key"


def key_file(settings: Settings) -> Path:
    return settings.data_dir / FILE


def read_key(settings: Settings) -> str | None:
    """The key a client on this machine sends: SLUICEGATE_API_KEY, else the stack's file."""
    if settings.api_key:
        return settings.api_key
    path = key_file(settings)
    if not path.exists():
        return None
    return path.read_text().strip() or None


def write_key(settings: Settings, key: str) -> Path:
    path = key_file(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(key + "\n")
    return path
