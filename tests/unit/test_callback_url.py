"""callback_url is checked at submit: an absolute http(s) URL with a host."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from plumbing.settings import Settings
from producers.jobs.submission import new_job
from schemas.api import SubmitJob
from schemas.jobs import JobKind
from schemas.webhooks import InvalidCallbackUrl, check_callback_url


@pytest.mark.parametrize(
    "url",
    [
        "http://example.com/hook",
        "https://hooks.example.com:8443/in?x=1",
        "http://10.0.0.1/hook",  # where it points is the dispatcher's call
        "https://[2001:db8::1]/hook",
    ],
)
def test_good(url: str) -> None:
    assert check_callback_url(url) == url


@pytest.mark.parametrize(
    "url",
    [
        "ftp://example.com/hook",
        "/relative/hook",
        "example.com/hook",
        "http://",
        "https:///path",
        "http://example.com:99999/",
        "http://example.com:0/",
        "http://exa mple.com/",
        "javascript:alert(1)",
        "",
    ],
)
def test_bad(url: str) -> None:
    with pytest.raises(InvalidCallbackUrl) as raised:
        check_callback_url(url)
    assert raised.value.code == "invalid_callback_url"
    assert raised.value.status == 422


def test_submit_refuses_a_bad_callback_url() -> None:
    body = SubmitJob(kind=JobKind.SUMMARIZE, input="text", callback_url="file:///etc/passwd")
    with pytest.raises(InvalidCallbackUrl):
        new_job(body, tenant="t", header_key=None, now=datetime.now(UTC), api=Settings().api)
