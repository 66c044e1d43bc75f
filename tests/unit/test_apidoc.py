"""docs/api.md is what ``python -m tools.apidoc`` makes of the app now, and it lists every
error code the code defines."""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import pytest

from producers.admission import policy as admission
from producers.admission.ratelimit import TenantLimits
from producers.api import errors
from schemas import reasons
from schemas.errors import SluicegateError
from tools import apidoc

ROOT = Path(__file__).resolve().parents[2]
# Where a code is written as a literal: a class's code, a handler's answer, a refusal.
CODE_LITERALS = (
    r'^\s+code = "([a-z_]+)"',
    r'error_response\(\s*[\w.]+,\s*"([a-z_]+)"',
    r'return \d{3}, "([a-z_]+)"',
    r'\b\d{3}: "([a-z_]+)"',
    r'\.get\(exc\.status_code, "([a-z_]+)"\)',
    r'Refused\(\s*"([a-z_]+)"',
    r'_over\(\w+, "([a-z_]+)"',
)


@pytest.fixture(scope="module")
def api_md() -> str:
    return apidoc.DOC.read_text(encoding="utf-8")


def documented(api_md: str) -> set[str]:
    return set(re.findall(r"^\| `([a-z_]+)` \|", api_md, re.MULTILINE))


def test_api_md_is_generated_from_the_app(api_md: str) -> None:
    assert api_md == apidoc.render(), (
        "docs/api.md is stale: run `python -m tools.apidoc --write` and commit it"
    )


def test_every_operation_is_documented(api_md: str) -> None:
    document = apidoc.openapi_document()
    for path, operations in document["paths"].items():
        for method in operations:
            assert f"### {method.upper()} {path}\n" in api_md


def _subclasses(cls: type) -> set[type]:
    found = set()
    for sub in cls.__subclasses__():
        found |= {sub, *_subclasses(sub)}
    return found


def test_every_error_class_code_is_documented(api_md: str) -> None:
    for room in ("schemas", "producers"):
        package = importlib.import_module(room)
        for module in pkgutil.walk_packages(package.__path__, f"{room}."):
            importlib.import_module(module.name)
    codes = {
        code
        for cls in _subclasses(SluicegateError)
        if isinstance(code := cls.__dict__.get("code"), str)
        and cls.__module__.split(".")[0] in ("schemas", "producers")
    }
    assert codes - documented(api_md) == set()


def test_every_literal_code_is_documented(api_md: str) -> None:
    """A cross-check of the tables in producers/api/errors.py and
    producers/admission/policy.py: every code written as a literal where an answer is made
    is in docs/api.md."""
    found: dict[str, str] = {}
    for room in ("schemas", "producers"):
        for path in sorted((ROOT / room).rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            for pattern in CODE_LITERALS:
                for code in re.findall(pattern, text, re.MULTILINE):
                    found.setdefault(code, str(path.relative_to(ROOT)))
    assert {"invalid_character", "lag_hard", "not_found", "job_not_found"} <= set(found)
    missing = {code: where for code, where in found.items() if code not in documented(api_md)}
    assert not missing, f"codes missing from docs/api.md: {missing}"


def test_every_refusal_is_documented(api_md: str) -> None:
    limits = TenantLimits(rpm=1, tpm=None)
    assert limits.try_take("t", 1, 0.0) is None
    rpm = limits.try_take("t", 1, 0.0)
    limits = TenantLimits(rpm=None, tpm=10)
    assert limits.try_take("t", 10, 0.0) is None
    tpm = limits.try_take("t", 10, 0.0)
    assert rpm is not None
    assert tpm is not None
    reasons_seen = {rpm[0], tpm[0], *admission.UNAVAILABLE}
    assert reasons_seen <= set(admission.REFUSALS)
    assert set(admission.REFUSALS) <= documented(api_md)


def test_every_handler_code_is_in_the_table() -> None:
    assert set(errors._FIELD_CODES.values()) <= set(errors.HANDLER_CODES)


def test_every_stop_reason_is_documented(api_md: str) -> None:
    assert set(reasons.MESSAGES) <= documented(api_md)
