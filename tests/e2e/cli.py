"""Run the ``sluicegate`` command as a user does: a separate process, its output not a
terminal."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.e2e.stack import RunningStack


@dataclass
class Ran:
    code: int
    output: str  # stdout and stderr together

    def lines(self) -> list[str]:
        return [line for line in self.output.splitlines() if line.strip()]


def env_for(data_dir: Path, stack: RunningStack | None = None, **extra: str) -> dict[str, str]:
    env = {**os.environ, "SLUICEGATE_DATA_DIR": str(data_dir), **extra}
    for key in ("SLUICEGATE_DATABASE_URL", "SLUICEGATE_API_KEY", "SLUICEGATE_API_PORT"):
        if key not in extra:
            env.pop(key, None)
    if stack is not None:
        env["SLUICEGATE_API_PORT"] = stack.api_url.rsplit(":", 1)[1]
    return env


def start(*args: str, env: dict[str, str], cwd: Path | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "sluicegate", *args],
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def run(*args: str, env: dict[str, str], timeout_s: float = 120) -> Ran:
    process = start(*args, env=env)
    output, _ = process.communicate(timeout=timeout_s)
    return Ran(process.returncode, output)


def assert_one_line_error(ran: Ran, code: int, *says: str) -> None:
    """A common mistake: a short message that says what to do, no traceback."""
    assert ran.code == code, ran.output
    assert "Traceback" not in ran.output, ran.output
    for text in says:
        assert text in ran.output, ran.output
