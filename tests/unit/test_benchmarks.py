"""The benchmarks' shape. Every scenario of ``python -m benchmarks`` imports and has the shape
the runner calls: ``parser()`` that takes the suite's arguments, ``--quick`` and ``--out``,
and ``main(argv)``; nothing is run. And the rules of benchmarks/, read from the source with
ast (nothing imported): every scenario is a module of benchmarks/scenarios/, no scenario
imports another (what two share is in benchmarks/lib/, which imports no scenario), and
modules and functions are as small as the shipped packages' (tests/unit/test_layout.py)."""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks import __main__ as runner

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
SCENARIOS = BENCHMARKS / "scenarios"
LIB = BENCHMARKS / "lib"
SCENARIO_PACKAGE = "benchmarks.scenarios"
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 400
# Modules at the top of benchmarks/ besides the runner: re-exports kept for tests that
# import the old paths, each with its reason. They hold imports only.

# Renaming or removing one of these is a change to the suite: change this list with it.
SUITE = ["admission", "kv_pull", "overload", "longpoll", "scale_out", "ingress"]
ONLY_WHEN_NAMED = [
    *("soak", "files", "retention", "costs", "relay_rate", "fleet", "brokers", "scale"),
    "overview",
    "isolation",
    "toast",
    "webhooks",
    "graphs",
]
# Scenarios the runner does not run, each with its reason (run as python -m
# benchmarks.scenarios.NAME); they have the runner's shape all the same.
NOT_IN_RUNNER = {
    "cli_start": "times the sluicegate command's start, by hand, for a before/after",
    "llamacpp_pull": "needs the model of `sluicegate model pull`",
}


# The runner and the scenarios' shape (imported).


def test_the_runner_knows_every_scenario() -> None:
    assert [s.name for s in runner.SCENARIOS if s.in_suite] == SUITE
    assert [s.name for s in runner.SCENARIOS if not s.in_suite] == ONLY_WHEN_NAMED
    assert sorted([*SUITE, *ONLY_WHEN_NAMED, *NOT_IN_RUNNER]) == scenario_files()
    assert {s.module for s in runner.SCENARIOS} == {
        f"{SCENARIO_PACKAGE}.{name}" for name in [*SUITE, *ONLY_WHEN_NAMED]
    }


def test_the_suite_fits_its_budget() -> None:
    expected = sum(s.expected_s for s in runner.SCENARIOS if s.in_suite)
    assert expected < runner.BUDGET_S


def every_scenario() -> list[runner.Scenario]:
    """The runner's scenarios, and the others with no arguments of the suite's."""
    others = [
        runner.Scenario(name=n, module=f"{SCENARIO_PACKAGE}.{n}", argv=(), expected_s=0)
        for n in NOT_IN_RUNNER
    ]
    return [*runner.SCENARIOS, *others]


@pytest.mark.parametrize("scenario", every_scenario(), ids=lambda s: s.name)
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


# The rules of benchmarks/ (read with ast).


def scenario_files() -> list[str]:
    """The scenarios' names: the modules of benchmarks/scenarios/."""
    return sorted(p.stem for p in SCENARIOS.glob("*.py") if p.name != "__init__.py")


def sources(folder: Path = BENCHMARKS) -> list[Path]:
    return sorted(folder.rglob("*.py"))


def where(path: Path) -> str:
    return str(path.relative_to(ROOT))


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), str(path))


def imported(tree: ast.Module, module: str, *, package: bool = False) -> Iterator[tuple[str, int]]:
    """(module imported, line) for every import anywhere in ``tree``, the source of the
    dotted ``module`` (``package``: its __init__.py). ``from a import b`` yields ``a.b``
    (``b`` may be a module of package ``a``); relative imports are resolved; a call of
    ``importlib.import_module`` or ``__import__`` with a literal name counts too."""
    base = module.split(".") if package else module.split(".")[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                up = base[: len(base) - (node.level - 1)]
                source = ".".join([*up, node.module] if node.module else up)
            else:
                source = node.module or ""
            for alias in node.names:
                yield f"{source}.{alias.name}", node.lineno
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            first = node.args[0]
            if name in ("import_module", "__import__") and isinstance(first, ast.Constant):
                yield str(first.value), node.lineno


def scenario_imports(tree: ast.Module, module: str, *, package: bool = False) -> list[str]:
    """The scenario modules (or the scenarios package) that ``module`` imports."""
    return [
        f"line {line}: {target}"
        for target, line in imported(tree, module, package=package)
        if target == SCENARIO_PACKAGE or target.startswith(f"{SCENARIO_PACKAGE}.")
    ]


def test_the_import_finder_sees_every_way_to_import_a_scenario() -> None:
    source = """
import benchmarks.scenarios.soak
from benchmarks.scenarios.costs import measure
from benchmarks.scenarios import fleet
from benchmarks import scenarios
from . import ingress
from .relay_rate import run
import importlib
importlib.import_module("benchmarks.scenarios.scale")

def later():
    from benchmarks.scenarios.kv_pull import document
"""
    found = scenario_imports(ast.parse(source), "benchmarks.scenarios.brokers")
    assert [f.split(": ")[1] for f in found] == [
        "benchmarks.scenarios.soak",
        "benchmarks.scenarios.costs.measure",
        "benchmarks.scenarios.fleet",
        "benchmarks.scenarios",
        "benchmarks.scenarios.ingress",
        "benchmarks.scenarios.relay_rate.run",
        "benchmarks.scenarios.scale",
        "benchmarks.scenarios.kv_pull.document",
    ]
    fine = """
import benchmarks.lib.stack
from benchmarks.lib.reports import OUT_DIR
from benchmarks.lib import relay
from . import stack
from .costs.measure import measure
"""
    assert scenario_imports(ast.parse(fine), "benchmarks.lib.offer") == []
    assert scenario_imports(ast.parse(fine), "benchmarks.lib.costs", package=True) == []


def test_every_scenario_module_lives_in_benchmarks_scenarios() -> None:
    """The runner's table names modules of benchmarks/scenarios/ that exist, and no module
    elsewhere in benchmarks/ has a scenario's shape (``main(argv)`` and ``parser()``)."""
    tree = parse(BENCHMARKS / "__main__.py")
    named = [
        kw.value.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "Scenario"
        for kw in node.keywords
        if kw.arg == "module" and isinstance(kw.value, ast.Constant)
    ]
    assert len(named) == len(SUITE) + len(ONLY_WHEN_NAMED)
    files = [f"{SCENARIO_PACKAGE}.{name}" for name in scenario_files()]
    assert set(named) <= set(files), f"the runner names modules that do not exist: {named}"
    shaped = []
    for path in sources():
        if path.parent == SCENARIOS or path == BENCHMARKS / "__main__.py":
            continue
        top = {n.name for n in parse(path).body if isinstance(n, ast.FunctionDef)}
        if {"main", "parser"} <= top:
            shaped.append(where(path))
    assert not shaped, f"scenarios outside benchmarks/scenarios/: {shaped}"


def test_the_top_of_benchmarks_holds_the_runner_lib_and_scenarios() -> None:
    """And nothing else: a scenario runs as ``python -m benchmarks.scenarios.<name>``."""
    entries = {p.name for p in BENCHMARKS.iterdir() if p.name != "__pycache__"}
    assert entries == {"__init__.py", "__main__.py", "lib", "scenarios"}


@pytest.mark.parametrize("name", scenario_files())
def test_every_scenario_runs_as_a_module(name: str) -> None:
    """``python -m benchmarks.scenarios.<name>`` runs its ``main``."""
    tree = parse(SCENARIOS / f"{name}.py")
    guards = [
        node
        for node in tree.body
        if isinstance(node, ast.If) and ast.unparse(node.test) == "__name__ == '__main__'"
    ]
    assert guards, f'{name}: no `if __name__ == "__main__":`'


@pytest.mark.parametrize("name", scenario_files())
def test_no_scenario_imports_another(name: str) -> None:
    path = SCENARIOS / f"{name}.py"
    wrong = scenario_imports(parse(path), module_name(path))
    assert not wrong, f"{where(path)} imports a scenario (move what they share to lib/):\n" + (
        "\n".join(wrong)
    )


def test_lib_imports_no_scenario() -> None:
    wrong = [
        f"{where(path)} {found}"
        for path in sources(LIB)
        for found in scenario_imports(
            parse(path), module_name(path), package=path.name == "__init__.py"
        )
    ]
    assert not wrong, "benchmarks/lib/ imports scenarios:\n" + "\n".join(wrong)


def function_lengths(tree: ast.Module) -> Iterator[tuple[str, int, int]]:
    """(name, line, length) of every function, counted from its first decorator."""
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            yield node.name, node.lineno, (node.end_lineno or node.lineno) - first + 1


def test_the_length_count_starts_at_the_decorator() -> None:
    body = "\n".join(["@decorated", "def f() -> None:", *["    pass"] * 78])
    assert [length for _, _, length in function_lengths(ast.parse(body))] == [80]
    longer = body + "\n    pass"
    assert [length for _, _, length in function_lengths(ast.parse(longer))] == [81]


def test_no_benchmark_function_is_over_80_lines() -> None:
    long = [
        f"{where(path)}:{line} {name} ({length} lines)"
        for path in sources()
        for name, line, length in function_lengths(parse(path))
        if length > MAX_FUNCTION_LINES
    ]
    assert sources(SCENARIOS), "benchmarks/scenarios/ looks empty"
    assert sources(LIB), "benchmarks/lib/ looks empty"
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(long)


def test_no_benchmark_module_is_over_400_lines() -> None:
    long = []
    for path in sources():
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MAX_MODULE_LINES:
            long.append(f"{where(path)} ({lines} lines)")
    assert not long, f"modules over {MAX_MODULE_LINES} lines:\n" + "\n".join(long)
