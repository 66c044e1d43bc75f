"""The web page's pure pieces: the CSRF checks of its writes, where a login may lead, the
lists' filters read from a query string, and the pipeline panel made from an overview."""

from __future__ import annotations

from urllib.parse import parse_qs

import pytest

from producers.ui import filters
from producers.ui.pages import templates
from producers.ui.session import CsrfRefused, check_write, csrf_token, safe_next, same_origin
from schemas.overview import AdmissionView, DeliveriesView, Overview
from schemas.states import JobState

KEY = "sk_0123456789ab_" + "s" * 40
JOB = "0190f6b4-5a2c-7c3e-9d1a-2b3c4d5e6f70"


def test_the_token_is_the_cookies_own() -> None:
    token = csrf_token(KEY)
    assert token == csrf_token(KEY)
    assert token != csrf_token(KEY[:-1] + "t")
    assert KEY not in token  # the key cannot be read back from a form


def test_a_write_with_its_token_from_this_host_passes() -> None:
    token = csrf_token(KEY)
    check_write(credential=KEY, token=token, origin="http://127.0.0.1:8000", host="127.0.0.1:8000")
    # TLS may end at a proxy in front: the scheme is not compared.
    check_write(credential=KEY, token=token, origin="https://ui.example", host="ui.example")
    # A browser that sends no Origin still has to send the token.
    check_write(credential=KEY, token=token, origin=None, host="ui.example")


@pytest.mark.parametrize(
    ("token", "origin"),
    [
        (None, "http://h"),
        ("", "http://h"),
        ("0" * 64, "http://h"),
        (csrf_token("sk_0123456789ab_" + "o" * 40), "http://h"),  # another session's
        ("right", "http://evil.example"),
        ("right", "null"),
        ("right", "http://h.evil.example"),
        ("right", "ftp://h"),
    ],
)
def test_a_forged_write_is_refused(token: str | None, origin: str) -> None:
    if token == "right":
        token = csrf_token(KEY)
    with pytest.raises(CsrfRefused) as refused:
        check_write(credential=KEY, token=token, origin=origin, host="h")
    assert refused.value.status == 403
    assert refused.value.code == "csrf_refused"


def test_same_origin_needs_a_host() -> None:
    assert same_origin(None, None)
    assert not same_origin("http://h", None)
    assert same_origin("http://H:80", "h:80")


@pytest.mark.parametrize(
    ("asked", "goes"),
    [
        (None, "/ui"),
        ("", "/ui"),
        ("/ui/jobs?state=queued", "/ui/jobs?state=queued"),
        ("https://evil.example/ui", "/ui"),
        ("//evil.example/ui", "/ui"),
        ("/docs", "/ui"),
        ("/uievil", "/ui"),
        ("/ui/../docs", "/ui/../docs"),  # this site's at worst: the browser resolves it
    ],
)
def test_a_login_goes_only_to_a_page_of_this_site(asked: str | None, goes: str) -> None:
    assert safe_next(asked) == goes


def parsed(query: str) -> filters.JobFilter:
    return filters.job_filter(parse_qs(query, keep_blank_values=True))


def test_an_empty_filter_form_is_no_filter() -> None:
    chosen = parsed("state=&model=&tenant=&batch_id=&limit=50")
    assert chosen == filters.JobFilter()
    assert chosen.problems == ()
    assert chosen.query() == ""


def test_filters_are_read_and_carried_by_the_paging_link() -> None:
    chosen = parsed(
        f"state=queued&state=RUNNING&state=queued&model=sim&tenant=acme&batch_id={JOB}&limit=20"
    )
    assert chosen.states == (JobState.QUEUED, JobState.RUNNING)
    assert (chosen.model, chosen.tenant, chosen.batch_id, chosen.limit) == ("sim", "acme", JOB, 20)
    assert chosen.problems == ()
    again = parsed(chosen.query(after=JOB))
    assert again == filters.JobFilter(
        states=chosen.states, model="sim", tenant="acme", batch_id=JOB, after=JOB, limit=20
    )
    assert parsed(again.query(after=None)).after is None


def test_unusable_values_are_named_and_left_out() -> None:
    chosen = parsed("state=sleeping&tenant=a%20b&batch_id=nope&after=1&limit=7&model=" + "m" * 200)
    assert chosen == filters.JobFilter()
    assert len(chosen.problems) == 6
    assert any("sleeping" in p for p in chosen.problems)
    assert any("limit" in p for p in chosen.problems)


def test_multi_groups_repeated_names() -> None:
    assert filters.multi([("state", "a"), ("model", "m"), ("state", "b")]) == {
        "state": ["a", "b"],
        "model": ["m"],
    }


def panel(deliveries: DeliveriesView) -> str:
    """The pipeline panel of an overview with only ``deliveries`` in it."""
    admission = AdmissionView(
        state="open", lag=0, lag_soft=100, lag_hard=200, reading_age_s=None, retry_after_s=None
    )
    view = Overview(
        generated_at=0.0,
        window_s=900,
        operator=False,
        admission=admission,
        jobs=[],
        drops=[],
        workers=[],
        deliveries=deliveries,
    )
    return templates.env.get_template("pipeline_panel.html").render(
        overview=view,
        models=[],
        counts={},
        job_states=[s.value for s in JobState],
        drain_rate=None,
        arrival_rate=None,
        blocked=0,
        poll_s=3,
    )


def test_the_pipeline_panel_shows_the_deliveries_waiting() -> None:
    behind = DeliveriesView(pending=10, due=3, oldest_due_s=75.04, behind=True)
    shown = panel(behind)
    assert 'id="deliveries-waiting"' in shown
    assert '<td id="deliveries-pending">10</td>' in shown
    assert '<td id="deliveries-due">3</td>' in shown
    assert '<span class="error">75.0 s ago</span>' in shown
    assert 'href="/ui/webhooks?state=pending"' in shown
    calm = panel(DeliveriesView(pending=2, due=0, oldest_due_s=None, behind=False))
    assert '<td id="deliveries-due">0</td>' in calm
    assert '<td id="deliveries-oldest-due">—</td>' in calm
