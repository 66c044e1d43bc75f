"""Where a running local stack is: ``data_dir/stack.json``, written by ``sluicegate up`` once
its processes run and removed when it stops, so that clients on this machine find its API
and ``sluicegate keys`` its database. Cheap to import (the standard library and
``sluicegate.local.lock``): clients import it at start."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sluicegate.local.lock import alive

INFO_FILE = "stack.json"


def info_path(data_dir: Path) -> Path:
    return data_dir / INFO_FILE


def write_info(data_dir: Path, info: dict[str, Any]) -> None:
    path = info_path(data_dir)
    partial = path.with_suffix(".tmp")
    partial.write_text(json.dumps(info, indent=2), encoding="utf-8")
    partial.replace(path)


def remove_info(data_dir: Path) -> None:
    info_path(data_dir).unlink(missing_ok=True)


def read_info(data_dir: Path) -> dict[str, Any] | None:
    """The running stack's record; None when there is none, or its ``up`` is gone."""
    try:
        info = json.loads(info_path(data_dir).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(info, dict) or not _alive(info.get("pid")):
        return None
    return info


def _alive(pid: object) -> bool:
    return isinstance(pid, int) and pid > 0 and alive(pid)
