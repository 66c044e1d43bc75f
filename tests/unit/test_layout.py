"""The shape of the shipped packages, read from their source with ast (nothing is imported):
small functions and modules, no import cycles, rooms that keep to themselves, SQL only in
stores and repositories; and the README and docs name only source files that exist."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# The shipped rooms (migrations/ is shipped too, but generated and never edited).
ROOMS = ("schemas", "plumbing", "producers", "workers", "client", "sluicegate")
OURS = (*ROOMS, "migrations", "tools", "tests", "benchmarks")
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 400
MAX_TOP_LEVEL = 15
SQL_NAMES = {"select", "insert", "update", "delete", "text"}
# Calls that run SQL: SQLAlchemy's and asyncpg's.
SQL_CALLS = {"execute", "executemany", "exec_driver_sql", "fetch", "fetchrow", "fetchval"}
SQL_MODULE_WORDS = ("repository", "store")
# Modules allowed SQL although their name says neither, each with its reason.
SQL_EXEMPT: dict[str, str] = {
    "schemas/tables.py": "table definitions: text() only for server defaults and index"
    " predicates, never a statement",
}
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SOURCE_PATH = re.compile(
    r"(?<![\w/.-])(?:producers|workers|sluicegate|schemas|plumbing|client)/[\w/]*?\w+\.py\b"
)


@dataclass(frozen=True)
class Module:
    name: str  # dotted: producers.api.app; a package is its __init__: producers.api
    path: Path
    tree: ast.Module
    lines: int

    @property
    def room(self) -> str:
        return self.name.split(".")[0]

    @property
    def where(self) -> str:
        return str(self.path.relative_to(ROOT))


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def modules() -> dict[str, Module]:
    found = {}
    for room in ROOMS:
        for path in sorted((ROOT / room).rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            name = _module_name(path)
            found[name] = Module(name, path, ast.parse(text, str(path)), len(text.splitlines()))
    return found


def _resolve(module: Module, node: ast.ImportFrom) -> str:
    """The absolute module a ``from ... import`` names (relative imports resolved)."""
    if node.level == 0:
        return node.module or ""
    package = module.name.split(".")
    if module.path.name != "__init__.py":
        package.pop()
    base = package[: len(package) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def imports(module: Module) -> Iterator[tuple[str, int]]:
    """(module imported, line) for every import statement anywhere in the module: at the
    top, under ``if TYPE_CHECKING:``, or inside a function. ``from a import b`` imports the
    module ``a.b`` when there is one, else ``a``."""
    known = modules()
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, node)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                yield (sub if sub in known else base), node.lineno


def _room_of(name: str) -> str:
    return name.split(".")[0]


# Sizes.


def test_no_function_is_over_80_lines() -> None:
    long = []
    for module in modules().values():
        for node in ast.walk(module.tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                length = (node.end_lineno or node.lineno) - first + 1
                if length > MAX_FUNCTION_LINES:
                    long.append(f"{module.where}:{node.lineno} {node.name} ({length} lines)")
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(long)


def test_no_module_is_over_400_lines() -> None:
    long = [
        f"{m.where} ({m.lines} lines)" for m in modules().values() if m.lines > MAX_MODULE_LINES
    ]
    assert not long, f"modules over {MAX_MODULE_LINES} lines:\n" + "\n".join(long)


@pytest.mark.parametrize("room", ROOMS)
def test_a_room_has_at_most_15_modules_at_its_top_level(room: str) -> None:
    """A sub-package counts as one entry; the package's own __init__.py does not count."""
    top = ROOT / room
    entries = sorted(
        p.name
        for p in top.iterdir()
        if (p.suffix == ".py" and p.name != "__init__.py")
        or (p.is_dir() and (p / "__init__.py").exists())
    )
    assert len(entries) <= MAX_TOP_LEVEL, f"{room}/ has {len(entries)} entries: {entries}"


# Imports.


def _graph() -> dict[str, dict[str, int]]:
    """module -> {module of ours it imports: line}."""
    known = modules()
    graph: dict[str, dict[str, int]] = {}
    for module in known.values():
        edges = graph.setdefault(module.name, {})
        for target, line in imports(module):
            if target in known and target != module.name:
                edges.setdefault(target, line)
    return graph


def _cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, {}):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _describe(component: list[str], graph: dict[str, dict[str, int]]) -> str:
    members = set(component)
    edges = [
        f"  {a} -> {b} (line {line})"
        for a in component
        for b, line in sorted(graph[a].items())
        if b in members
    ]
    return "cycle of " + ", ".join(component) + ":\n" + "\n".join(edges)


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycles({"a": {"b": 1}, "b": {}}) == []


def test_no_import_cycle() -> None:
    graph = _graph()
    assert sum(len(edges) for edges in graph.values()) > 100, "the graph looks empty"
    cycles = _cycles(graph)
    assert not cycles, "\n".join(_describe(c, graph) for c in cycles)


def _imports_of_rooms(room: str, forbidden: tuple[str, ...]) -> list[str]:
    wrong = []
    for module in modules().values():
        if module.room != room:
            continue
        for target, line in imports(module):
            if _room_of(target) in forbidden:
                wrong.append(f"{module.where}:{line} imports {target}")
    return wrong


# The layers: each room may import only the rooms below it (schemas <- plumbing <-
# producers / workers / client <- sluicegate, the composition root, which nothing imports).
MAY_IMPORT: dict[str, set[str]] = {
    "schemas": set(),
    "plumbing": {"schemas"},
    "producers": {"schemas", "plumbing"},
    "workers": {"schemas", "plumbing"},
    "client": {"schemas", "plumbing"},
    "sluicegate": {"schemas", "plumbing", "producers", "workers", "client", "migrations"},
}


@pytest.mark.parametrize("room", ROOMS)
def test_a_room_imports_only_the_rooms_below_it(room: str) -> None:
    forbidden = tuple(r for r in OURS if r != room and r not in MAY_IMPORT[room])
    wrong = _imports_of_rooms(room, forbidden)
    assert not wrong, f"{room} may import only {sorted(MAY_IMPORT[room])}:\n" + "\n".join(wrong)


def test_every_room_has_its_layer() -> None:
    assert set(MAY_IMPORT) == set(ROOMS)


def test_the_layer_check_sees_a_wrong_import() -> None:
    source = "from sluicegate.local import model\nimport workers.kv\n"
    module = Module("producers.x", ROOT / "producers" / "x.py", ast.parse(source), 2)
    rooms = {_room_of(target) for target, _ in imports(module)}
    assert rooms == {"sluicegate", "workers"}
    assert rooms - MAY_IMPORT["producers"] == {"sluicegate", "workers"}


def test_schemas_imports_nothing_of_ours() -> None:
    wrong = _imports_of_rooms("schemas", tuple(r for r in OURS if r != "schemas"))
    assert not wrong, "\n".join(wrong)


def test_the_backoff_limits_are_defined_once() -> None:
    """Every loop that retries goes through plumbing.retry, where its limits are."""
    found = [
        f"{m.where} {target.id}"
        for m in modules().values()
        for node in ast.walk(m.tree)
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name) and target.id in ("MAX_BACKOFF_S", "FIRST_BACKOFF_S")
    ]
    assert sorted(found) == [
        "plumbing/retry.py FIRST_BACKOFF_S",
        "plumbing/retry.py MAX_BACKOFF_S",
    ], found


# Tests.


def _test_modules() -> Iterator[tuple[str, ast.Module]]:
    for path in sorted((ROOT / "tests").rglob("*.py")):
        yield str(path.relative_to(ROOT)), ast.parse(path.read_text(encoding="utf-8"))


def _imported_test_modules(tree: ast.Module) -> list[str]:
    found = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        found += [
            n for n in names if n.startswith("tests.") and n.rsplit(".", 1)[-1].startswith("test_")
        ]
    return found


def test_no_test_module_imports_another() -> None:
    wrong = [
        f"{where} imports {name}"
        for where, tree in _test_modules()
        for name in _imported_test_modules(tree)
    ]
    assert not wrong, "tests share through fixtures and helpers:\n" + "\n".join(wrong)


def test_the_test_import_check_sees_one() -> None:
    source = (
        "from tests.faults.test_worker_kill import DOC\n"
        "from tests.unit import test_gate\n"
        "from tests.support import dispatch\n"
    )
    assert _imported_test_modules(ast.parse(source)) == [
        "tests.faults.test_worker_kill",
        "tests.unit.test_gate",
    ]


# SQL.


def _sql_reasons(module: Module) -> list[str]:
    """Why a module builds or runs SQL: it imports a statement builder from sqlalchemy,
    calls one through the sqlalchemy module, or calls ``.execute(`` (or another of
    ``SQL_CALLS``)."""
    reasons: list[tuple[int, str]] = []
    sqlalchemy_names = set()
    for node in ast.walk(module.tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "sqlalchemy":
            names = sorted(a.name for a in node.names if a.name in SQL_NAMES)
            if names:
                reasons.append((node.lineno, f"imports {', '.join(names)}"))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "sqlalchemy":
                    sqlalchemy_names.add(alias.asname or alias.name.split(".")[0])
    for node in ast.walk(module.tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        attr, owner = node.func.attr, node.func.value
        if attr in SQL_CALLS:
            reasons.append((node.lineno, f"calls .{attr}("))
        elif attr in SQL_NAMES and isinstance(owner, ast.Name) and owner.id in sqlalchemy_names:
            reasons.append((node.lineno, f"calls {owner.id}.{attr}("))
    return [f"line {line} {what}" for line, what in sorted(reasons)]


def test_sql_is_built_only_in_stores_and_repositories() -> None:
    wrong = []
    for module in modules().values():
        own_name = module.name.rsplit(".", 1)[-1]
        if any(word in own_name for word in SQL_MODULE_WORDS) or module.where in SQL_EXEMPT:
            continue
        if reasons := _sql_reasons(module):
            wrong.append(f"{module.where}: {'; '.join(reasons[:3])}")
    assert not wrong, "SQL outside a *repository*/*store* module:\n" + "\n".join(wrong)


def test_the_sql_finder_sees_sql() -> None:
    source = (
        "import sqlalchemy as sa\n"
        "from sqlalchemy import select, Column\n"
        "async def f(conn):\n"
        "    await conn.execute(sa.text('select 1'))\n"
        "    await conn.fetchval('select 1')\n"
    )
    module = Module("x.y", ROOT / "x" / "y.py", ast.parse(source), 5)
    assert _sql_reasons(module) == [
        "line 2 imports select",
        "line 4 calls .execute(",
        "line 4 calls sa.text(",
        "line 5 calls .fetchval(",
    ]


# Docs.


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_source_file_the_docs_name_exists(doc: Path) -> None:
    named = set(SOURCE_PATH.findall(doc.read_text(encoding="utf-8")))
    missing = sorted(path for path in named if not (ROOT / path).is_file())
    assert not missing, f"{doc.name} names files that do not exist: {missing}"


def test_the_docs_check_sees_the_paths() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    api = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    assert SOURCE_PATH.findall("see `producers/jobs/group_commit.py` and tests/workers/x.py") == [
        "producers/jobs/group_commit.py"
    ]
    assert SOURCE_PATH.findall(readme + api)
