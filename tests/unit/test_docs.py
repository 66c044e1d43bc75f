"""The README and docs/*.md name only settings and metrics the code defines."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from plumbing.settings import Settings
from schemas import constants
from schemas import webhooks as webhook_schemas
from tests.unit.deploy.metrics import exported_series
from workers.engines.sim.protocol import CompletionRequest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SETTING = re.compile(r"\bSLUICEGATE_([A-Z0-9_]+)(\*)?")
METRIC = re.compile(r"(?<![\w.:/-])sluicegate_[a-z0-9_]+\b")


def _names_outside_settings() -> set[str]:
    """SLUICEGATE_* variables that are not settings: Compose's own (``${SLUICEGATE_X}`` in
    docker-compose.yml), the test suite's and the benchmarks' (read from the environment by
    tests/ and benchmarks/)."""
    compose = (ROOT / "docker-compose.yml").read_text(encoding="utf-8")
    names = set(re.findall(r"\$\{(SLUICEGATE_[A-Z0-9_]+)", compose))
    names -= {f"SLUICEGATE_{f.upper()}" for f in Settings.model_fields}
    for path in [*(ROOT / "tests").rglob("*.py"), *(ROOT / "benchmarks").rglob("*.py")]:
        text = path.read_text(encoding="utf-8")
        names |= set(
            re.findall(r"environ(?:\.get)?\W+\"(SLUICEGATE_(?:TEST|BENCH)_[A-Z0-9_]+)\"", text)
        )
    return names


def _names_not_metrics() -> set[str]:
    """sluicegate_* names the code defines that are not metrics: NOTIFY channels, and the
    sim-server's request field."""
    values = [*vars(constants).values(), *vars(webhook_schemas).values()]
    channels = {v for v in values if isinstance(v, str) and v.startswith("sluicegate_")}
    channels -= _metrics()
    fields = {f for f in CompletionRequest.model_fields if f.startswith("sluicegate_")}
    return channels | fields


def _metrics() -> set[str]:
    names = {v for k, v in vars(constants).items() if k.startswith("M_") and isinstance(v, str)}
    names |= {
        v for k, v in vars(webhook_schemas).items() if k.startswith("M_") and isinstance(v, str)
    }
    return names | set(exported_series())


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_setting_named_is_a_field_of_settings(doc: Path) -> None:
    fields = set(Settings.model_fields)
    others = _names_outside_settings()
    wrong = set()
    for match in SETTING.finditer(doc.read_text(encoding="utf-8")):
        name, prefix = match.group(1).lower(), match.group(2)
        if prefix:  # SLUICEGATE_SIM_*: some settings start so
            ok = any(f.startswith(name) for f in fields)
        else:
            ok = name in fields or match.group(0) in others
        if not ok:
            wrong.add(match.group(0))
    assert not wrong, f"{doc.name} names settings that do not exist: {sorted(wrong)}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_metric_named_is_defined(doc: Path) -> None:
    known = _metrics() | _names_not_metrics()
    wrong = set(METRIC.findall(doc.read_text(encoding="utf-8"))) - known
    assert not wrong, f"{doc.name} names metrics the code does not define: {sorted(wrong)}"


def test_the_checks_see_the_names() -> None:
    """Neither check passes because it found nothing to check."""
    ops = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    assert "sluicegate_lag_records" in METRIC.findall(ops)
    assert "KV_WATERMARK" in {m.group(1) for m in SETTING.finditer(ops)}
    assert "SLUICEGATE_TEST_VLLM_MODEL" in _names_outside_settings()
    assert "SLUICEGATE_API_REPLICAS" in _names_outside_settings()
    assert "sluicegate_jobs" in _names_not_metrics()
    assert "sluicegate_kind" in _names_not_metrics()


def _shell_blocks(text: str) -> list[str]:
    return re.findall(r"```sh\n(.*?)\n```", text, flags=re.S)


def test_the_readme_opens_with_the_ci_test_command() -> None:
    """.ci/run runs exactly the README's second command (the tests), whitespace aside."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    ci_command = ci.split('cd "$(dirname "$0")/.."\n', 1)[1]
    blocks = _shell_blocks(readme)
    assert len(blocks) >= 2, "the README opens with the demo command and the test command"
    assert " ".join(blocks[1].split()) == " ".join(ci_command.split())
