"""`sluicegate summarize` on the local stack: 1,000 documents as one batch, interrupted and
resumed, ending in a results file in the OpenAI Batch output shape."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from client.samples import sample_documents
from tests.e2e.stack import RunningStack

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

DOCUMENTS = 1000


def write_documents(directory: Path) -> list[str]:
    samples = [text for _, text in sample_documents()]
    names = []
    for i in range(DOCUMENTS):
        name = f"part-{i // 100}/doc-{i:04d}.txt"
        path = directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"Document {i}.\n{samples[i % len(samples)]}")
        names.append(name)
    return names


def summarize(
    stack: RunningStack, docs: Path, out: Path, data_dir: Path, *flags: str
) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "SLUICEGATE_DATA_DIR": str(data_dir),
        "SLUICEGATE_API_PORT": stack.api_url.rsplit(":", 1)[1],
        "PYTHONUNBUFFERED": "1",  # what it said before a SIGKILL is read
        "COLUMNS": "300",  # a line each
    }
    command = ["summarize", str(docs), "--deadline", "30m", "--out", str(out), *flags]
    return subprocess.Popen(
        [sys.executable, "-m", "sluicegate", *command, "--max-tokens", "24"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def lines_in(out: Path) -> int:
    return out.read_bytes().count(b"\n") if out.exists() else 0


def test_a_thousand_documents_summarized_interrupted_and_resumed(
    stack_factory: Callable[..., RunningStack], tmp_path: Path
) -> None:
    stack = stack_factory(workers=2)
    docs = tmp_path / "docs"
    names = write_documents(docs)
    out = tmp_path / "results.jsonl"

    first = summarize(stack, docs, out, tmp_path)
    deadline = time.monotonic() + 120
    while lines_in(out) == 0 and time.monotonic() < deadline and first.poll() is None:
        time.sleep(0.05)
    first.send_signal(signal.SIGKILL)  # as hard an interruption as there is
    first.wait()
    assert first.stdout is not None
    first.stdout.close()
    interrupted_at = lines_in(out)
    assert 0 < interrupted_at < DOCUMENTS, "the first run must be cut off part way"

    second = summarize(stack, docs, out, tmp_path)
    output, _ = second.communicate(timeout=360)
    assert second.returncode == 0, output
    assert "completed" in output

    results = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["custom_id"] for r in results] == names  # each once, in input order
    for r in results:
        assert r["id"] == f"batch_req_{r['sluicegate']['job_id']}"
        assert r["error"] is None
        assert r["response"]["status_code"] == 200
        body = r["response"]["body"]
        assert body["text"]
        assert body["engine"] == "sim"
        assert r["sluicegate"]["state"] == "succeeded"

    # The rerun submitted nothing: one batch, of 1,000 jobs.
    with httpx.Client(base_url=stack.api_url, headers=stack.headers) as client:
        batches = client.get("/v1/batches").json()["data"]
    assert len(batches) == 1
    assert batches[0]["request_counts"] == {"total": DOCUMENTS, "completed": DOCUMENTS, "failed": 0}
    assert batches[0]["status"] == "completed"


def test_a_new_run_into_a_missing_folder_is_resumed_by_the_same_command(
    stack_factory: Callable[..., RunningStack], tmp_path: Path
) -> None:
    # The 300 must not all end between two of the command's 5 s looks: slowed steps, and at
    # most 32 decoded at once, so they end in waves (with 256 at once, a worker that joined
    # late, as on Tansu, or a fast drain ended them all inside one look).
    stack = stack_factory(
        workers=1, SLUICEGATE_SIM_TIME_SCALE="3", SLUICEGATE_SIM_MAX_NUM_SEQS="32"
    )
    docs = tmp_path / "docs"
    written = write_documents(docs)
    names = written[:300]
    for extra in written[300:]:
        (docs / extra).unlink()
    (docs / "README").write_text("not read")
    (docs / "data.json").write_text("{}")
    out = tmp_path / "run1" / "results.jsonl"  # run1/ does not exist

    first = summarize(stack, docs, out, tmp_path, "--new")
    deadline = time.monotonic() + 120
    while lines_in(out) == 0 and time.monotonic() < deadline and first.poll() is None:
        time.sleep(0.05)
    first.send_signal(signal.SIGKILL)
    output, _ = first.communicate()
    assert 0 < lines_in(out) < len(names), output
    assert "passed over 2 other files (README, data.json): only PDF, Word (.docx)" in output
    with httpx.Client(base_url=stack.api_url, headers=stack.headers) as client:
        [batch] = client.get("/v1/batches").json()["data"]
    counts = batch["request_counts"]
    done_before = counts["completed"] + counts["failed"]
    assert done_before >= lines_in(out)

    second = summarize(stack, docs, out, tmp_path, "--new")  # the same command again
    output, _ = second.communicate(timeout=360)
    assert second.returncode == 0, output
    said = re.search(
        rf"resuming batch {batch['id']} .*: (\d+) of {len(names)} already done", output
    )
    assert said, output
    # Every result the batch had, whatever its place in the input order.
    assert int(said.group(1)) >= done_before
    assert "passed over 2 other files (README, data.json) (not of a kind that is read)" in output
    listed = out.with_name("results.skipped.jsonl").read_text().splitlines()
    assert {json.loads(x)["custom_id"]: json.loads(x)["error"]["code"] for x in listed} == {
        "README": "unsupported_format",
        "data.json": "unsupported_format",
    }
    results = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["custom_id"] for r in results] == names
    with httpx.Client(base_url=stack.api_url, headers=stack.headers) as client:
        batches = client.get("/v1/batches").json()["data"]
    assert [b["id"] for b in batches] == [batch["id"]]  # the rerun submitted nothing
