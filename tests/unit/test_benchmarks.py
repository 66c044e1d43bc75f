"""Every scenario of ``python -m benchmarks`` imports and has the shape the runner calls:
``parser()`` that takes the suite's arguments, ``--quick`` and ``--out``, and ``main(argv)``.
Nothing is run."""

from __future__ import annotations

import argparse
import importlib
import inspect

import pytest

from benchmarks import __main__ as runner

# Renaming or removing one of these is a change to the suite: change this list with it.
SUITE = ["admission", "kv_pull", "overload", "longpoll", "scale_out", "ingress"]
ONLY_WHEN_NAMED = ["soak", "files", "retention", "costs", "relay_rate", "fleet", "brokers", "scale"]


def test_the_runner_knows_every_scenario() -> None:
    assert [s.name for s in runner.SCENARIOS if s.in_suite] == SUITE
    assert [s.name for s in runner.SCENARIOS if not s.in_suite] == ONLY_WHEN_NAMED


def test_the_suite_fits_its_budget() -> None:
    expected = sum(s.expected_s for s in runner.SCENARIOS if s.in_suite)
    assert expected < runner.BUDGET_S


@pytest.mark.parametrize("scenario", runner.SCENARIOS, ids=lambda s: s.name)
def test_a_scenario_has_the_shape_the_runner_calls(scenario: runner.Scenario) -> None:
    module = importlib.import_module(scenario.module)
    assert runner.entry(module) is module.main
    assert list(inspect.signature(module.main).parameters) == ["argv"]
    parser = module.parser()
    assert isinstance(parser, argparse.ArgumentParser)
    suite = parser.parse_args([*scenario.argv, "--out", "x.json"])
    quick = parser.parse_args(["--quick", "--out", "x.json"])
    assert quick.quick
    assert not suite.quick
    assert str(suite.out) == str(quick.out) == "x.json"
    headline = getattr(module, "headline", None)
    assert headline is None or callable(headline)


def test_the_runner_parses_its_options() -> None:
    args = runner.parser().parse_args(["--only", "scale_out", "--only", "soak", "--quick"])
    assert args.only == ["scale_out", "soak"]
    assert args.quick
