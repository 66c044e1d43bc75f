"""The first hour of a user, through the ``sluicegate`` command against a real local stack:
real folders, refusals, progress, reruns and common mistakes, each a few plain lines."""

from __future__ import annotations

import json
import re
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from client.samples import sample_documents
from sluicegate.local.embedded import free_port
from tests.e2e.cli import assert_one_line_error, env_for, run, start
from tests.e2e.stack import RunningStack, start_stack

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]
MAX_BYTES = 4 * 1_048_576


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningStack]:
    # A static speed estimate, so that a deadline too short for it is refused on a fresh stack.
    running = start_stack(
        tmp_path_factory.mktemp("stack"),
        workers=1,
        extra_env={"SLUICEGATE_DEADLINE_SPEED": "static"},
    )
    yield running
    running.stop()


def data_dir_of(stack: RunningStack) -> Path:
    return Path(stack.log.name).parent


def write_folder(directory: Path, good: int) -> list[str]:
    """``good`` documents, plus a Latin-1 file, an empty one and one over the limit."""
    samples = [text for _, text in sample_documents()]
    names = []
    for i in range(good):
        path = directory / f"docs/doc-{i:03d}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"Document {i}.\n{samples[i % len(samples)]}")
        names.append(path.relative_to(directory).as_posix())
    (directory / "latin1.txt").write_bytes("Caf\xe9 cr\xe8me: notes from Lyon.".encode("latin-1"))
    (directory / "empty.md").write_bytes(b"")
    (directory / "huge.txt").write_text("word " * (MAX_BYTES // 5 + 10))
    return names


def test_a_folder_with_bad_files_runs_the_good_ones_and_says_partial(
    stack: RunningStack, tmp_path: Path
) -> None:
    folder = tmp_path / "folder"
    names = write_folder(folder, good=6)
    env = env_for(data_dir_of(stack), stack)
    out = tmp_path / "results.jsonl"

    strict = run("summarize", str(folder), "--out", str(out), "--strict", env=env)
    assert_one_line_error(strict, 2, "nothing was submitted (--strict)", "skipped latin1.txt")
    assert not out.exists()

    ran = run("summarize", str(folder), "--out", str(out), env=env)
    assert ran.code == 3, ran.output  # done, but partial
    assert "Traceback" not in ran.output
    lines = ran.lines()
    assert lines[0] == f"read 9 files from {folder}: 6 to summarize, 3 skipped"
    assert "skipped empty.md: the file is empty" in ran.output
    assert "skipped huge.txt:" in ran.output
    assert "over the limit of 4,194,304 (4 MiB) per document" in ran.output
    assert "skipped latin1.txt: not UTF-8: byte 0xe9" in ran.output
    assert any(line.startswith("submitted batch ") for line in lines), ran.output
    assert any(" ended " in line for line in lines), ran.output  # progress, not on a terminal
    counted = next(i for i, line in enumerate(lines) if "6 of 6 succeeded" in line)
    # Then the summaries cut at --max-tokens, if any (the simulator's extracts of long
    # documents are), and last the files skipped.
    assert all("cut at --max-tokens (128)" in line for line in lines[counted + 1 : -1])
    assert lines[-1] == f"3 files skipped, listed in {tmp_path / 'results.skipped.jsonl'}"

    results = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["custom_id"] for r in results] == names
    listed = (tmp_path / "results.skipped.jsonl").read_text().splitlines()
    skipped = [json.loads(line) for line in listed]
    assert {s["custom_id"]: s["error"]["code"] for s in skipped} == {
        "empty.md": "empty",
        "huge.txt": "too_large",
        "latin1.txt": "undecodable",
    }

    # The same input to a new --out: the earlier batch is reused, and said to be.
    again = run("summarize", str(folder), "--out", str(tmp_path / "again.jsonl"), env=env)
    assert again.code == 3, again.output
    assert "reusing batch " in again.output
    assert "--new submits a new batch" in again.output
    fresh = run("summarize", str(folder), "--out", str(tmp_path / "fresh.jsonl"), "--new", env=env)
    assert fresh.code == 3, fresh.output
    assert "submitted batch " in fresh.output
    with httpx.Client(base_url=stack.api_url, headers=stack.headers) as client:
        batches = client.get("/v1/batches").json()["data"]
    assert len({b["id"] for b in batches}) >= 2
    record = json.loads((tmp_path / "fresh.jsonl.batch").read_text())
    assert record["deadline"].endswith("+00:00")  # an absolute time, not "24h"


def test_interrupted_with_ctrl_c_then_resumed(stack: RunningStack, tmp_path: Path) -> None:
    folder = tmp_path / "folder"
    names = write_folder(folder, good=300)
    env = env_for(data_dir_of(stack), stack)
    out = tmp_path / "results.jsonl"
    first = start("summarize", str(folder), "--out", str(out), "--max-tokens", "64", env=env)
    assert first.stdout is not None
    seen = []
    for line in first.stdout:  # interrupt once the batch runs (a resume after lines were
        seen.append(line)  # written is the kill -9 test of test_summarize.py)
        if line.startswith("submitted batch"):
            break
    first.send_signal(signal.SIGINT)
    rest, _ = first.communicate(timeout=30)
    output = "".join(seen) + rest
    assert first.returncode == 130, output
    assert "interrupted: run the same command again to resume" in output
    assert "Traceback" not in output
    assert "KeyboardInterrupt" not in output

    had = out.read_text().count("\n") if out.exists() else 0
    second = run("summarize", str(folder), "--out", str(out), "--max-tokens", "64", env=env)
    assert second.code == 3, second.output
    assert "resuming batch " in second.output
    # The honest count: what the batch has done (whatever its order), beside what the
    # results file holds (written in input order).
    done = re.search(r": ([\d,]+) of 300 already done, ([\d,]+) written to (\S+) ", second.output)
    assert done is not None, second.output
    assert int(done[1].replace(",", "")) >= had
    assert (int(done[2].replace(",", "")), done[3]) == (had, str(out))
    results = [json.loads(line)["custom_id"] for line in out.read_text().splitlines()]
    assert results == names


def test_a_deadline_the_stack_cannot_meet_ends_at_once(stack: RunningStack, tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "one.txt").write_text("One short document to summarize.")
    env = env_for(data_dir_of(stack), stack)
    ran = run(
        "summarize", str(tmp_path / "docs"), "--deadline", "2s", "--max-tokens", "500", env=env
    )
    # 500 tokens at the static 0.02 s a token is 10 s: a retry can never succeed.
    assert_one_line_error(ran, 4, "deadline_unreachable")
    assert "retrying" not in ran.output


def test_wrong_or_missing_key_names_where_it_was_read(stack: RunningStack, tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("A document.")
    wrong = env_for(data_dir_of(stack), stack, SLUICEGATE_API_KEY="sk_000000000000_nope")
    ran = run("submit", str(tmp_path / "a.txt"), env=wrong)
    assert_one_line_error(ran, 4, "the API refused the key from SLUICEGATE_API_KEY")

    elsewhere = tmp_path / "other-data"
    ran = run("submit", str(tmp_path / "a.txt"), "--api", stack.api_url, env=env_for(elsewhere))
    assert_one_line_error(ran, 4, f"{elsewhere / 'api_key'} does not exist", "sluicegate up")


def test_keys_next_to_the_local_stack_find_its_database(
    stack: RunningStack, tmp_path: Path
) -> None:
    env = env_for(data_dir_of(stack))
    ran = run("keys", "create", "alice", env=env)
    assert ran.code == 0, ran.output
    key = ran.lines()[-1]
    with httpx.Client(base_url=stack.api_url) as client:
        answer = client.get("/v1/batches", headers={"Authorization": f"Bearer {key}"})
    assert answer.status_code == 200, answer.text


def test_no_stack_running_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("A document.")
    env = env_for(tmp_path / "data")
    nowhere = f"http://127.0.0.1:{free_port()}"
    for command in (["submit"], ["summarize", "--out", str(tmp_path / "r.jsonl")]):
        ran = run(*command, str(tmp_path / "a.txt"), "--api", nowhere, env=env)
        assert_one_line_error(ran, 5, f"cannot reach the Sluicegate API at {nowhere}", "up")
    ran = run("keys", "create", "alice", env=env)
    assert_one_line_error(ran, 2, "no local stack runs on", "sluicegate up")
    for role in ("api", "relay", "worker", "webhooks", "migrate"):
        assert_one_line_error(run(role, env=env), 1, "SLUICEGATE_DATABASE_URL is not set")


def test_bad_flags_and_input_are_one_line(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("A document.")
    env = env_for(tmp_path / "data")
    cases = [
        (["summarize", str(tmp_path), "--deadline", "3x"], "--deadline '3x' is not a duration"),
        (["summarize", str(tmp_path), "--encoding", "klingon"], "no such encoding"),
        (["summarize", str(tmp_path / "missing")], "does not exist"),
        (["summarize", str(tmp_path), "--max-tokens", "many"], "invalid int value"),
    ]
    for args, says in cases:
        assert_one_line_error(run(*args, env=env), 2, says)
    bad_env = env_for(tmp_path / "data", SLUICEGATE_API_PORT="eighty")
    assert_one_line_error(
        run("submit", str(tmp_path / "a.txt"), env=bad_env), 1, "SLUICEGATE_API_PORT is not valid"
    )
    # The pools: not JSON, a misspelt setting, a bad value, a worker of no pool, --models.
    pools = [
        ({"SLUICEGATE_POOLS": "{alpha}"}, ["SLUICEGATE_POOLS is not valid", "must be JSON"]),
        ({"SLUICEGATE_POOLS": '{"a": {"lag_hrd": 5}}'}, ["the pool of 'a' sets lag_hrd"]),
        ({"SLUICEGATE_POOLS": '{"a": {"partitions": 0}}'}, ["the pool of 'a': partitions"]),
        (
            {"SLUICEGATE_POOLS": '{"a": {}}', "SLUICEGATE_WORKER_MODEL": "b"},
            ["worker_model 'b' is not one of the pools: a"],
        ),
    ]
    for extra, says in pools:
        ran = run("worker", env=env_for(tmp_path / "data", **extra))
        assert_one_line_error(ran, 1, *says)
    assert_one_line_error(run("up", "--models", ",", env=env), 1, "--models names no model")
    assert_one_line_error(run("up", "--models", "a,a", env=env), 1, "names a model twice")


def test_help_shows_defaults_and_limits(tmp_path: Path) -> None:
    env = env_for(tmp_path)
    top = run("--help", env=env)
    assert top.code == 0
    assert "composition root" not in top.output
    assert "sluicegate up" in top.output
    summarize = run("summarize", "--help", env=env).output
    for text in ("default: results.jsonl", "default: 24h", "default: 128", "4 MiB", "--strict"):
        assert text in summarize, summarize


def test_refusals_speak_and_a_lost_stack_is_one_line(
    stack_factory: Callable[..., RunningStack], tmp_path: Path
) -> None:
    # One request a minute per tenant: the second run is refused until the bucket refills.
    # (A batch is not refused for lag: it is held and metered in.)
    stack = stack_factory(workers=0, SLUICEGATE_TENANT_RPM="1")
    env = env_for(tmp_path, stack)
    for name in ("a", "b", "c", "d"):
        (tmp_path / "three" / f"{name}.txt").parent.mkdir(exist_ok=True)
    for name in ("a", "b", "c"):
        (tmp_path / "three" / f"{name}.txt").write_text(f"Document {name}.")
    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "d.txt").write_text("Document d.")

    # Three jobs wait in the queue; nothing consumes them.
    waiting = start(
        "summarize", str(tmp_path / "three"), "--out", str(tmp_path / "3.jsonl"), env=env
    )
    assert waiting.stdout is not None
    for line in waiting.stdout:
        if line.startswith("submitted batch"):
            break
    refused = start("summarize", str(tmp_path / "one"), "--out", str(tmp_path / "1.jsonl"), env=env)
    assert refused.stdout is not None
    seen = []
    for line in refused.stdout:
        seen.append(line)
        if line.startswith("refused (tenant_rpm):"):
            break
    assert "retrying in" in seen[-1], seen
    assert ", at " in seen[-1], seen
    refused.send_signal(signal.SIGINT)
    rest, _ = refused.communicate(timeout=30)
    assert refused.returncode == 130, "".join(seen) + rest

    stack.stop()  # the stack goes away under a running summarize
    output, _ = waiting.communicate(timeout=60)
    assert waiting.returncode == 5, output
    assert "cannot reach the Sluicegate API" in output
    assert "run this again to resume" in output
    assert "Traceback" not in output
