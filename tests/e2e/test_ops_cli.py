"""`sluicegate status`, `jobs`, `jobs show`, `batches`, `keys list` and `webhooks redeliver`
against one real local stack, as a user runs them: what they print matches the API, and
each common mistake is one line with its exit code."""

from __future__ import annotations

import http.server
import re
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from sluicegate.local.embedded import free_port
from tests.e2e.cli import assert_one_line_error, env_for, run, start
from tests.e2e.stack import RunningStack, start_stack, submit, wait_terminal

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]
STATES = ("queued", "dispatched", "running", "succeeded", "failed", "expired", "cancelled")


class Accepting(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(204)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def receiver() -> Iterator[str]:
    """A webhook receiver on loopback that accepts every delivery."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Accepting)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningStack]:
    running = start_stack(
        tmp_path_factory.mktemp("stack"),
        workers=1,
        args=["--engine", "sim"],
        extra_env={"SLUICEGATE_WEBHOOK_ALLOW_NETWORKS": '["127.0.0.1/32"]'},
    )
    yield running
    if running.process.poll() is None:
        running.stop()


def env_of(stack: RunningStack) -> dict[str, str]:
    return env_for(Path(stack.log.name).parent, stack)


def table(output: str, first: str) -> list[list[str]]:
    """The rows of the table whose header starts with ``first`` (header included), up to
    the first line that is not one of its rows."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:1] == [first])
    width = len(lines[start].split())
    rows = [lines[start].split()]
    for line in lines[start + 1 :]:
        cells = line.split()
        if len(cells) != width:
            break
        rows.append(cells)
    return rows


def test_status_jobs_batches_and_keys_show_what_the_api_has(
    stack: RunningStack, receiver: str
) -> None:
    env = env_of(stack)
    ids = submit(stack, 3)
    with httpx.Client(base_url=stack.api_url, headers=stack.headers, timeout=10) as api:
        line = {"custom_id": "a", "method": "POST", "url": "/v1/completions"}
        made = api.post(
            "/v1/batches",
            json={"requests": [{**line, "body": {"prompt": "Hello.", "max_tokens": 4}}]},
        )
        assert made.status_code == 201, made.text
        batch_id = made.json()["id"]
        assert api.post("/v1/webhooks/secrets").status_code == 201  # deliveries are signed
        hooked = api.post(
            "/v1/jobs",
            json={"kind": "complete", "input": "Hi.", "max_tokens": 4, "callback_url": receiver},
        ).json()["id"]
        wait_terminal(stack, [*ids, hooked])
        deadline = time.monotonic() + 30
        while (deliveries := api.get("/v1/webhooks/deliveries").json()["data"]) == [] or (
            deliveries[0]["state"] == "pending"
        ):
            assert time.monotonic() < deadline, str(deliveries[0])
            time.sleep(0.2)
        overview = api.get("/v1/overview").json()

    status = run("status", env=env)
    assert status.code == 0, status.output
    admission = overview["admission"]
    assert f"admission {admission['state']}" in status.output
    assert f"(soft {admission['lag_soft']}, hard {admission['lag_hard']})" in status.output
    jobs = table(status.output, "model")
    states = jobs[0][1:]
    shown = {
        (row[0], state): int(n)
        for row in jobs[1:]
        for state, n in zip(states, row[1:], strict=True)
        if n != "-"
    }
    assert shown == {(c["model"], c["state"]): c["count"] for c in overview["jobs"]}
    assert shown[("default", "succeeded")] >= 4, status.output
    assert overview["workers"], overview
    for w in overview["workers"]:  # idle now: none running
        row = rf"^\s*{w['id']}\s+{w['model']}\s+sim \(simulated\)\s+0/{w['capacity']}\s"
        assert re.search(row, status.output, re.M), status.output

    listed = run("jobs", "--state", "succeeded", env=env)
    assert listed.code == 0, listed.output
    rows = [line.split() for line in listed.lines()[1:]]
    assert {row[0] for row in rows} >= {*ids, hooked}
    assert {tuple(row[1:4]) for row in rows} == {("succeeded", "default", "default")}
    assert run("jobs", "--state", "queued", env=env).lines() == ["no jobs"]
    two = run("jobs", "--limit", "2", env=env)
    assert len(two.lines()) == 4, two.output  # the header, two jobs, and the hint
    assert two.lines()[-1].startswith("more jobs: raise --limit")

    shown_job = run("jobs", "show", hooked, env=env)
    assert shown_job.code == 0, shown_job.output
    assert re.search(rf"job\s+{hooked}", shown_job.output)
    assert re.search(r"state\s+succeeded", shown_job.output)
    assert re.search(r"engine\s+sim", shown_job.output)
    assert f"to {receiver}: delivered" in shown_job.output
    assert re.search(r"^\s*1\s+\S+ \S+\s+204\s", shown_job.output, re.M), shown_job.output

    batches = run("batches", env=env)
    assert batches.code == 0, batches.output
    assert re.search(rf"^\s*{batch_id}\s+\w+\s+\d+\s+\d+\s+1\s", batches.output, re.M)
    assert run("batches", "--status", "cancelled", env=env).lines() == ["no batches"]

    keys = run("keys", "list", env=env)
    assert keys.code == 0, keys.output
    assert re.search(r"^\s*sk_\w+\s+default\s.*\byes\b", keys.output, re.M), keys.output

    delivered = deliveries[0]["id"]
    again = run("webhooks", "redeliver", delivered, env=env)
    assert_one_line_error(again, 4, "409 delivery_not_dead", "is delivered")
    assert len(again.lines()) == 1, again.output


def test_mistakes_are_one_line(stack: RunningStack) -> None:
    env = env_of(stack)
    unknown = run("jobs", "show", "0190a1b2-0000-7000-8000-000000000000", env=env)
    assert_one_line_error(unknown, 4, "404 job_not_found")
    assert len(unknown.lines()) == 1, unknown.output
    no_delivery = run("webhooks", "redeliver", "msg_nope", env=env)
    assert_one_line_error(no_delivery, 4, "404 delivery_not_found")
    wrong_key = run("status", env={**env, "SLUICEGATE_API_KEY": "sk_wrong"})
    assert_one_line_error(wrong_key, 4, "the API refused the key from SLUICEGATE_API_KEY")
    bad_state = run("jobs", "--state", "done", env=env)
    assert_one_line_error(bad_state, 2, "invalid choice: 'done'")
    bad_window = run("status", "--window", "soon", env=env)
    assert_one_line_error(bad_window, 2, "--window: 'soon' is not a duration")


def test_watch_stops_quietly_on_ctrl_c_and_status_says_when_the_stack_is_gone(
    stack: RunningStack,
) -> None:
    env = env_of(stack)
    watch = start("status", "--watch", "--interval", "0.5", env=env)
    assert watch.stdout is not None
    seen = []
    deadline = time.monotonic() + 30
    while not any(line.startswith("admission") for line in seen):
        assert time.monotonic() < deadline, seen
        seen.append(watch.stdout.readline())
    watch.send_signal(signal.SIGINT)
    rest, _ = watch.communicate(timeout=30)
    assert watch.returncode == 130, rest
    assert "Traceback" not in "".join(seen) + rest

    stack.stop()
    gone = run("status", env=env)
    assert_one_line_error(gone, 5, "cannot reach the Sluicegate API", "is the stack running?")
    assert len(gone.lines()) == 1, gone.output
    elsewhere = run("status", "--api", f"http://127.0.0.1:{free_port()}", env=env)
    assert_one_line_error(elsewhere, 5, "is the stack running?")
