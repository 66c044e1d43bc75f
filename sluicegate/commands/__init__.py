"""The ``sluicegate`` commands, each imported only when it runs (``sluicegate.cli``)."""

from __future__ import annotations

import sys

from pydantic import ValidationError
from pydantic_settings import SettingsError

from plumbing.settings import Settings


def settings_or_exit() -> Settings:
    """The settings, or one line naming the SLUICEGATE_* variable that is wrong."""
    try:
        return Settings()
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        if not first["loc"]:  # a rule across settings (the pools): its message names them
            sys.exit(f"sluicegate: the settings are not valid: {first['msg']}")
        name = "SLUICEGATE_" + "_".join(str(p) for p in first["loc"]).upper()
        sys.exit(f"sluicegate: {name} is not valid: {first['msg']} (got {first.get('input')!r})")
    except SettingsError as exc:  # a JSON-valued variable that is not JSON
        field = str(exc).split('"')[1] if '"' in str(exc) else ""
        name = f"SLUICEGATE_{field.upper()}" if field else "a SLUICEGATE_* variable"
        sys.exit(f"sluicegate: {name} is not valid: it must be JSON ({exc.__cause__ or exc})")
