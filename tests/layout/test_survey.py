"""Issue 45's survey of the shipped packages, read with ast (nothing is imported). Each check
must find none:

- SQL spliced by string replacement in a repository or store;
- one class name defined in two places;
- another library's private attribute read or written;
- a module named after a KIP number;
- a setting kept only for comparison.

Each check also has a test that feeds it an offender, so that it cannot pass by seeing
nothing."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ("producers", "workers", "plumbing", "schemas", "client", "sluicegate")
ALL_CAPS = re.compile(r"^_*[A-Z][A-Z0-9_]*$")
SQL_WORDS = re.compile(
    r"\b(SELECT|INSERT|UPDATE|DELETE|FROM|WHERE|JOIN|RETURNING|VALUES|ORDER BY|GROUP BY)\b"
)
# Underscore names that are their library's documented public API.
PUBLIC_UNDERSCORE = {
    "_mapping": "SQLAlchemy's Row._mapping",
    "_replace": "namedtuple",
    "_asdict": "namedtuple",
    "_fields": "namedtuple",
    "_make": "namedtuple",
}
KIP = re.compile(r"kip\d+", re.IGNORECASE)
FOR_COMPARISON = re.compile(
    r"\b(for|as a) comparison\b|\b(kept |only )?(to|for) compar(e|ing)\b|\bcomparison only\b",
    re.IGNORECASE,
)
SETTINGS = "plumbing/settings/"


@dataclass(frozen=True)
class Module:
    where: str  # the path from the repository root: workers/repository.py
    tree: ast.Module


@cache
def shipped() -> tuple[Module, ...]:
    return tuple(
        Module(str(path.relative_to(ROOT)), ast.parse(path.read_text(encoding="utf-8")))
        for room in SHIPPED
        for path in sorted((ROOT / room).rglob("*.py"))
    )


def _module(where: str, source: str) -> Module:
    return Module(where, ast.parse(source))


def _by_line(found: list[str]) -> list[str]:
    """``where:line ...`` lines in line order (ast.walk goes breadth first)."""
    return sorted(found, key=lambda line: int(line.split(" ", 1)[0].rsplit(":", 1)[1]))


def _report(what: str, offenders: list[str]) -> str:
    return f"{what}:\n" + "\n".join(offenders)


# SQL spliced by string replacement.


def _is_sql_module(where: str) -> bool:
    name = where.rsplit("/", 1)[-1]
    return name.endswith("repository.py") or name.endswith("_store.py")


def _text(node: ast.expr) -> str | None:
    """A string constant's text (an f-string's constant parts), else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value for v in node.values if isinstance(v, ast.Constant))
    return None


def spliced_sql(module: Module) -> list[str]:
    """``.replace(...)`` calls on a string constant or an ALL_CAPS name (a statement), or
    with SQL in their arguments, in a repository or store."""
    if not _is_sql_module(module.where):
        return []
    found = []
    for node in ast.walk(module.tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr != "replace":
            continue
        receiver = node.func.value
        named = (isinstance(receiver, ast.Name) and ALL_CAPS.match(receiver.id)) or (
            isinstance(receiver, ast.Attribute) and ALL_CAPS.match(receiver.attr)
        )
        sql_args = any(SQL_WORDS.search(_text(a) or "") for a in node.args)
        if named or _text(receiver) is not None or sql_args:
            found.append(f"{module.where}:{node.lineno} {ast.unparse(node)[:80]}")
    return _by_line(found)


def test_no_sql_is_spliced_by_string_replacement() -> None:
    found = [line for m in shipped() for line in spliced_sql(m)]
    assert not found, _report("SQL spliced with .replace() in a repository or store", found)


def test_the_splice_check_sees_one() -> None:
    source = (
        "_Q = 'SELECT 1 MARKS'\n"
        "A = text(_Q.replace('MARKS', ''))\n"
        "B = 'SELECT MARKS'.replace('MARKS', ', x')\n"
        "C = template.replace('X', 'WHERE id = 1')\n"
        "D = payload.decode().replace('\\x00', '?')\n"
    )
    assert [line.split()[0] for line in spliced_sql(_module("a/b_store.py", source))] == [
        "a/b_store.py:2",
        "a/b_store.py:3",
        "a/b_store.py:4",
    ]
    assert spliced_sql(_module("a/views.py", source)) == []


# One class name, two places.


def classes(modules: tuple[Module, ...]) -> dict[str, list[str]]:
    """Class name -> where each class of that name is defined (nested ones too)."""
    found: dict[str, list[str]] = defaultdict(list)
    for module in modules:
        for node in ast.walk(module.tree):
            if isinstance(node, ast.ClassDef):
                found[node.name].append(f"{module.where}:{node.lineno}")
    return found


def twice_defined(modules: tuple[Module, ...]) -> list[str]:
    return [
        f"{name}: {', '.join(places)}"
        for name, places in sorted(classes(modules).items())
        if len(places) > 1
    ]


def test_no_class_name_is_defined_twice() -> None:
    found = twice_defined(shipped())
    assert not found, _report("class names defined in more than one place", found)


def test_the_class_check_sees_a_name_defined_twice() -> None:
    modules = (
        _module("a/x.py", "class Round:\n    pass\nclass Meter:\n    pass\n"),
        _module("b/y.py", "\n\nclass Round:\n    pass\n"),
    )
    assert twice_defined(modules) == ["Round: a/x.py:1, b/y.py:3"]


# Another library's private attributes.


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _allowed(node: ast.Attribute) -> bool:
    if node.attr in PUBLIC_UNDERSCORE:
        return True
    # confluent-kafka's documented error codes: KafkaError._PARTITION_EOF, ._FATAL...
    owner = node.value
    owner_name = owner.id if isinstance(owner, ast.Name) else getattr(owner, "attr", None)
    return owner_name == "KafkaError" and ALL_CAPS.match(node.attr) is not None


def held_by_contract() -> set[str]:
    """The private names ``tests/unit/test_library_contracts.py`` reads: an internal that
    test holds to the pinned version (it fails loudly when the internal moves)."""
    path = ROOT / "tests" / "unit" / "test_library_contracts.py"
    held = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            held.add(node.attr)
    return held


def _own(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id in ("self", "cls")


def private_reads(module: Module, held: frozenset[str] = frozenset()) -> list[str]:
    """``x._name`` (read, written or deleted) where ``x`` is not ``self`` or ``cls``, and
    ``getattr``/``setattr``/``hasattr``/``delattr`` of such a name, less the names their
    library documents (``PUBLIC_UNDERSCORE``, ``KafkaError._CODE``) and those ``held``
    by a contract test."""
    found = []
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Attribute):
            if node.attr in held:
                continue
            if _private(node.attr) and not _own(node.value) and not _allowed(node):
                found.append(f"{module.where}:{node.lineno} {ast.unparse(node)[:80]}")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr", "delattr")
            and len(node.args) >= 2
            and not _own(node.args[0])
        ):
            name = _text(node.args[1])
            if (
                name is not None
                and _private(name)
                and name not in PUBLIC_UNDERSCORE
                and name not in held
            ):
                found.append(f"{module.where}:{node.lineno} {ast.unparse(node)[:80]}")
    return _by_line(found)


def test_no_private_attribute_of_another_library_is_used() -> None:
    held = frozenset(held_by_contract())
    found = [line for m in shipped() for line in private_reads(m, held)]
    assert not found, _report("another library's private attributes", found)


def test_the_private_attribute_check_sees_one() -> None:
    source = (
        "def f(self, producer, row, sample, consumer):\n"
        "    producer._sender.x = 1\n"
        "    row._mapping, sample._replace(a=1), self._own, KafkaError._FATAL\n"
        "    getattr(consumer, '_coordinator', None)\n"
        "    getattr(consumer, '__name__'), obj.__dict__\n"
        "    error.code() == kafka.KafkaError._PARTITION_EOF\n"
    )
    assert private_reads(_module("a/x.py", source)) == [
        "a/x.py:2 producer._sender",
        "a/x.py:4 getattr(consumer, '_coordinator', None)",
    ]


# A module named after a KIP.


def kip_modules(wheres: list[str]) -> list[str]:
    return [where for where in wheres if KIP.search(where)]


def test_no_module_is_named_after_a_kip() -> None:
    found = kip_modules([m.where for m in shipped()])
    assert not found, _report("modules named after a KIP number (name what they do)", found)


def test_the_kip_check_sees_one() -> None:
    wheres = ["workers/group/kip848.py", "workers/KIP392/x.py", "workers/skip.py"]
    assert kip_modules(wheres) == ["workers/group/kip848.py", "workers/KIP392/x.py"]


# A setting kept only for comparison.


def _descriptions(module: Module) -> Iterator[tuple[int, str, str]]:
    """(line, field, description) of each ``name: T = Field(..., description=...)``."""
    for node in ast.walk(module.tree):
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.value, ast.Call)):
            continue
        call, target = node.value, node.target
        if not (isinstance(call.func, ast.Name) and call.func.id == "Field"):
            continue
        field = target.id if isinstance(target, ast.Name) else ast.unparse(target)
        for keyword in call.keywords:
            if keyword.arg == "description" and (text := _text(keyword.value)) is not None:
                yield node.lineno, field, text


def kept_for_comparison(module: Module) -> list[str]:
    if not module.where.startswith(SETTINGS):
        return []
    return _by_line(
        [
            f"{module.where}:{line} {field}: ...{match.group(0)}..."
            for line, field, text in _descriptions(module)
            if (match := FOR_COMPARISON.search(text))
        ]
    )


def test_no_setting_is_kept_only_for_comparison() -> None:
    found = [line for m in shipped() for line in kept_for_comparison(m)]
    assert not found, _report("settings that exist to compare with (drop the option)", found)


def test_the_comparison_check_sees_one() -> None:
    source = (
        "class S(SettingsGroup):\n"
        "    policy: str = Field(default='kv', description='`greedy` takes all '\n"
        "        '(for comparison).')\n"
        "    every_s: float = Field(default=1.0, description='How often it compares rows.')\n"
        "    mode: str = Field(default='a', description=f'Kept to compare with {OLD}.')\n"
    )
    found = kept_for_comparison(_module("plumbing/settings/x.py", source))
    assert [line.split()[0] for line in found] == [
        "plumbing/settings/x.py:2",
        "plumbing/settings/x.py:5",
    ]
