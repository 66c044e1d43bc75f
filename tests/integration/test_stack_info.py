"""Where the local stack's processes serve their metrics, and ``data_dir/stack.json``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from plumbing.settings import Settings
from sluicegate.local import info as stack_info
from sluicegate.local.stack import ChildProcess, Stack


def stack_of(tmp_path: Path, workers: int = 2, **settings: Any) -> Stack:
    """A stack whose processes are listed and given their ports, none started."""
    stack = Stack(Settings(data_dir=tmp_path, **settings), workers=workers)
    stack._children = [
        ChildProcess("api", ["api"]),
        ChildProcess("relay", ["relay"]),
        ChildProcess("webhooks", ["webhooks"]),
        *(ChildProcess(f"worker-{i + 1}", ["worker"]) for i in range(workers)),
    ]
    stack._give_metrics_ports()
    return stack


def ports(stack: Stack) -> dict[str, int]:
    return {
        c.role: int(c.env["SLUICEGATE_METRICS_PORT"])
        for c in stack._children
        if "SLUICEGATE_METRICS_PORT" in c.env
    }


def test_every_role_but_the_api_gets_a_metrics_port_of_its_own(tmp_path: Path) -> None:
    stack = stack_of(tmp_path, api_port=8123)
    given = ports(stack)
    assert set(given) == {"relay", "webhooks", "worker-1", "worker-2"}
    assert len(set(given.values())) == 4
    assert 8123 not in given.values()
    assert stack.metrics_urls() == {
        "api": "http://127.0.0.1:8123/metrics",
        **{role: f"http://127.0.0.1:{port}/metrics" for role, port in given.items()},
    }


def test_two_asks_for_a_free_port_that_get_the_same_one_give_two_ports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    answers = iter([8123, 5000, 5000, 5001, 5001, 5002, 5003])  # the kernel may repeat itself
    monkeypatch.setattr("sluicegate.local.stack.free_port", lambda: next(answers))
    stack = stack_of(tmp_path, api_port=8123)
    assert ports(stack) == {"relay": 5000, "webhooks": 5001, "worker-1": 5002, "worker-2": 5003}


def test_a_metrics_port_the_user_sets_is_the_first_of_consecutive_ones(tmp_path: Path) -> None:
    # One port for every process made them all bind it: all but the first crash-looped.
    stack = stack_of(tmp_path, metrics_port=9100)
    assert ports(stack) == {"relay": 9100, "webhooks": 9101, "worker-1": 9102, "worker-2": 9103}


async def test_an_inherited_metrics_port_is_a_base_and_each_child_keeps_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLUICEGATE_METRICS_PORT", "9200")  # in the environment of `up`
    spawned: list[dict[str, str]] = []

    class Started:
        pid = 1

    async def exec_(*args: str, env: dict[str, str], **kwargs: object) -> Started:
        spawned.append(env)
        return Started()

    monkeypatch.setattr("sluicegate.local.stack.asyncio.create_subprocess_exec", exec_)
    stack = stack_of(tmp_path)
    api, relay, webhooks = stack._children[:3]
    for child in (relay, relay, webhooks, api):  # the relay twice: a restart
        await stack._spawn(child)
    given = [env.get("SLUICEGATE_METRICS_PORT") for env in spawned]
    assert given == ["9200", "9200", "9201", None]  # the API serves /metrics on its own port


def test_the_banner_rows_name_every_url_and_the_logs(tmp_path: Path) -> None:
    stack = stack_of(tmp_path, workers=1, api_port=8123)
    stack.log_dir = tmp_path / "logs"
    rows = dict(stack.urls())
    assert rows["API"] == "http://127.0.0.1:8123"
    assert rows["api metrics"] == "http://127.0.0.1:8123/metrics"
    assert {"relay metrics", "webhooks metrics", "worker-1 metrics"} <= set(rows)
    assert rows["logs"] == str(tmp_path / "logs")


def test_stack_json_is_read_while_its_up_lives(tmp_path: Path) -> None:
    stack = stack_of(tmp_path, workers=1)
    stack.database_url, stack.bootstrap = "postgresql://db", "127.0.0.1:9092"
    assert stack_info.read_info(tmp_path) is None  # no stack yet
    stack_info.write_info(tmp_path, stack.info())
    info = stack_info.read_info(tmp_path)
    assert info is not None
    assert set(info) == {"pid", "api", "database", "kafka", "broker", "metrics", "logs", "data_dir"}
    # A broker given in the settings is not the stack's own.
    assert info["broker"] == {
        "kind": "external",
        "version": None,
        "bootstrap": "127.0.0.1:9092",
        "pid": None,
    }
    assert info["metrics"] == stack.metrics_urls()
    assert (info["database"], info["kafka"], info["logs"]) == (
        "postgresql://db",
        "127.0.0.1:9092",
        None,
    )
    stack_info.remove_info(tmp_path)
    assert stack_info.read_info(tmp_path) is None


def test_stack_json_of_a_dead_up_or_a_damaged_one_is_no_stack(tmp_path: Path) -> None:
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    stack_info.write_info(tmp_path, {"pid": int(gone.stdout), "api": "http://127.0.0.1:1"})
    assert stack_info.read_info(tmp_path) is None
    stack_info.info_path(tmp_path).write_text("{not json")
    assert stack_info.read_info(tmp_path) is None
    stack_info.info_path(tmp_path).write_text(json.dumps(["a list"]))
    assert stack_info.read_info(tmp_path) is None
