"""The real model for the llama.cpp tests: the one `sluicegate model pull` put in place.

Nothing here downloads. A machine without the model fails these tests with the command that
fetches it, rather than skipping them: CI runs `sluicegate model pull` before pytest.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from plumbing.settings import Settings
from sluicegate.local import model as models


def bundled_model() -> Path:
    """The GGUF file: SLUICEGATE_TEST_MODEL if set, else the pulled model in the default
    data directory."""
    if explicit := os.environ.get("SLUICEGATE_TEST_MODEL"):
        path = Path(explicit)
    else:
        path = models.model_path(Settings().data_dir)
    if not path.is_file():
        pytest.fail(f"no model at {path}: run `sluicegate model pull` first", pytrace=False)
    return path
