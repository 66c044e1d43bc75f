"""``plumbing.metrics.label``: a role's sluicegate_* families are exported with the labels of
the process (a worker's pool model) without any call site naming them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prometheus_client import Counter, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

import workers.metrics  # noqa: F401  (the worker's families, registered)
from plumbing.metrics import CONSTANT_LABELS, exported, exposition, label, registry
from schemas import constants as c


@pytest.fixture
def labelled_worker() -> Iterator[None]:
    """The worker's families exported as a worker of pool ``beta`` exports them, and a
    family of this test's own with a label of its own (``reason``) and one that names
    ``model`` itself; everything as it was afterwards."""
    own = Counter(
        "sluicegate_test_labels", "This test's", ["reason", "model"], registry=registry("worker")
    )
    own.labels(reason="because", model="own").inc()
    label("worker", model="beta")
    try:
        yield
    finally:
        label("worker")
        registry("worker").unregister(own)


def samples(text: bytes) -> list[Sample]:
    return [s for family in text_string_to_metric_families(text.decode()) for s in family.samples]


def named(text: bytes, name: str) -> list[Sample]:
    found = [s for s in samples(text) if s.name == name]
    assert found, f"no {name} in the exposition"
    return found


@pytest.mark.usefixtures("labelled_worker")
def test_every_sample_of_a_worker_family_carries_the_model() -> None:
    text = exposition("worker")
    (started,) = named(text, c.M_JOBS_STARTED)
    assert started.labels == {"model": "beta"}
    buckets = named(text, c.M_JOB_SECONDS + "_bucket")
    assert len(buckets) > 1
    assert all(b.labels["model"] == "beta" and "le" in b.labels for b in buckets)
    ours = [s for s in samples(text) if s.name.startswith("sluicegate_")]
    assert ours
    assert all("model" in s.labels for s in ours)


@pytest.mark.usefixtures("labelled_worker")
def test_a_family_keeps_its_own_labels() -> None:
    (own,) = named(exposition("worker"), "sluicegate_test_labels_total")
    assert own.labels == {"reason": "because", "model": "own"}


@pytest.mark.usefixtures("labelled_worker")
def test_the_process_collectors_and_other_roles_are_left_as_they_are() -> None:
    (info,) = named(exposition("worker"), "python_info")
    assert "model" not in info.labels
    assert all("model" not in s.labels for s in samples(exposition("relay")))


@pytest.mark.usefixtures("labelled_worker")
def test_the_registry_itself_reads_as_defined() -> None:
    """In-process readers (tests, benchmarks) ask the registry without the model."""
    assert registry("worker").get_sample_value(c.M_JOBS_STARTED) is not None
    assert registry("worker").get_sample_value(c.M_JOBS_STARTED, {"model": "beta"}) is None


@pytest.mark.usefixtures("labelled_worker")
def test_a_scrape_of_some_names_is_labelled_too() -> None:
    """``/metrics?name[]=...`` serves a restricted view of the exported registry."""
    view = exported("worker").restricted_registry([c.M_JOBS_STARTED])
    (started,) = samples(generate_latest(view))
    assert (started.name, started.labels) == (c.M_JOBS_STARTED, {"model": "beta"})


def test_without_labels_a_family_is_exported_as_defined() -> None:
    label("worker")  # as if no worker had run in this process (run_worker labels it)
    (started,) = named(exposition("worker"), c.M_JOBS_STARTED)
    assert started.labels == {}


def test_a_role_takes_its_own_labels_only() -> None:
    assert CONSTANT_LABELS["worker"] == {"model"}
    with pytest.raises(ValueError, match="model"):
        label("api", model="beta")
    with pytest.raises(ValueError, match="model"):
        label("worker", pool="beta")
    with pytest.raises(ValueError, match="model"):
        label("worker", model="beta", gpu="0")
    label("worker", model="beta")
    label("worker", model="gamma")  # replaces
    try:
        (started,) = named(exposition("worker"), c.M_JOBS_STARTED)
        assert started.labels == {"model": "gamma"}
    finally:
        label("worker")
