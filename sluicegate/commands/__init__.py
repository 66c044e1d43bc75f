"""The ``sluicegate`` commands, each imported only when it runs (``sluicegate.cli``)."""

from __future__ import annotations

import sys

from pydantic import ValidationError

from plumbing.settings import Settings


def settings_or_exit() -> Settings:
    """The settings, or one line naming the SLUICEGATE_* variable that is wrong."""
    try:
        return Settings()
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        name = "SLUICEGATE_" + "_".join(str(p) for p in first["loc"]).upper()
        sys.exit(f"sluicegate: {name} is not valid: {first['msg']} (got {first.get('input')!r})")
