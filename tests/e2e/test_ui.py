"""The web page at /ui in a real browser (headless chromium, tests/e2e/browser.py) on a
stack started as a user starts it: log in with the stack's key (and once with a wrong one),
cancel a job that no worker will take, watch the pipeline panel; then, restarted with a
worker, follow a job to succeeded on its timeline and a batch to its output file.

``UI_SCREENSHOTS_DIR=docs/ui`` saves the pages as PNGs there (docs/ui.md shows them).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from tests.e2e import browser
from tests.e2e.stack import RunningStack

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

DOCUMENT = "The page shows every job and batch at a glance. " * 4


def shot(driver: WebDriver, name: str) -> None:
    folder = os.environ.get("UI_SCREENSHOTS_DIR")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        size = driver.get_window_size()
        height = driver.execute_script("return document.documentElement.scrollHeight")
        driver.set_window_size(size["width"], min(int(height) + 140, 2400))  # the whole page
        driver.save_screenshot(str(Path(folder) / f"{name}.png"))
        driver.set_window_size(size["width"], size["height"])


def text_of(driver: WebDriver, element_id: str) -> str:
    found = driver.find_elements(By.ID, element_id)
    return found[0].text if found else ""


def submit_job(client: httpx.Client) -> str:
    made = client.post("/v1/jobs", json={"kind": "summarize", "input": DOCUMENT, "max_tokens": 32})
    assert made.status_code == 202, made.text
    job_id: str = made.json()["id"]
    return job_id


def create_batch(client: httpx.Client) -> str:
    lines = [
        {
            "custom_id": f"line-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": "sim",
                "messages": [{"role": "user", "content": f"Say {i}."}],
                "max_tokens": 16,
            },
        }
        for i in range(3)
    ]
    made = client.post("/v1/batches", json={"requests": lines})
    assert made.status_code == 201, made.text
    batch_id: str = made.json()["id"]
    return batch_id


def log_in(driver: WebDriver, stack: RunningStack, key: str) -> None:
    driver.get(f"{stack.api_url}/ui/jobs")
    browser.wait_for(driver, lambda d: "/ui/login" in d.current_url, "the redirect to the login")
    field = driver.find_element(By.ID, "key")
    field.clear()
    field.send_keys(key)
    driver.find_element(By.ID, "login").click()


def the_key(stack: RunningStack) -> str:
    return stack.headers["Authorization"].removeprefix("Bearer ")


def test_cancel_and_pipeline_on_a_stack_without_workers(
    stack_factory: Callable[..., RunningStack], tmp_path: Path
) -> None:
    stack = stack_factory(workers=0)
    with httpx.Client(base_url=stack.api_url, headers=stack.headers, timeout=30) as client:
        queued = submit_job(client)
    with browser.chromium(tmp_path / "downloads") as driver:
        log_in(driver, stack, "sk_000000000000_" + "x" * 40)
        error = browser.wait_for(
            driver, lambda d: text_of(d, "login-error"), "the wrong key's error"
        )
        assert "Unknown or revoked API key" in error
        assert "Traceback" not in driver.page_source

        log_in(driver, stack, the_key(stack))
        browser.wait_for(driver, lambda d: d.find_elements(By.ID, "jobs"), "the jobs list")
        assert queued[-12:] in driver.find_element(By.ID, "jobs").text

        driver.get(f"{stack.api_url}/ui/jobs/{queued}")
        state = text_of(driver, "job-state")
        assert state in ("queued", "dispatched"), state
        driver.find_element(By.ID, "cancel-job").click()
        browser.wait_for(
            driver, lambda d: text_of(d, "job-state") == "cancelled", "the job cancelled"
        )
        assert not driver.find_elements(By.ID, "cancel-job")
        assert text_of(driver, "end-reason") == "cancelled"

        # The pipeline: the lag read, admission open, and the cancel among the drops.
        driver.get(f"{stack.api_url}/ui/pipeline")
        lag = browser.wait_for(
            driver,
            lambda d: text_of(d, "lag") not in ("", "unknown") and text_of(d, "lag"),
            "a known lag",
        )
        assert int(lag) >= 0
        assert text_of(driver, "admission-state") in ("open", "throttling", "refusing")
        browser.wait_for(
            driver, lambda d: "cancelled" in text_of(d, "drops"), "the cancel among the drops"
        )
        assert "No worker has reported" in text_of(driver, "workers")
    with httpx.Client(base_url=stack.api_url, headers=stack.headers, timeout=30) as client:
        assert client.get(f"/v1/jobs/{queued}").json()["state"] == "cancelled"
    # A write without the page's token is refused, whatever the cookie.
    cookie = {"sluicegate_ui": the_key(stack)}
    with httpx.Client(base_url=stack.api_url, cookies=cookie, timeout=30) as page:
        forged = page.post(f"/ui/jobs/{queued}/cancel", data={"csrf": "forged"})
        assert forged.status_code == 403, forged.text
        assert "csrf_refused" in forged.text
    assert stack.stop() == 0


def test_a_job_and_a_batch_followed_to_their_end(
    stack_factory: Callable[..., RunningStack], tmp_path: Path
) -> None:
    stack = stack_factory(workers=1)
    with httpx.Client(base_url=stack.api_url, headers=stack.headers, timeout=30) as client:
        job_id = submit_job(client)
        batch_id = create_batch(client)
    with browser.chromium(tmp_path / "downloads") as driver:
        log_in(driver, stack, the_key(stack))
        browser.wait_for(driver, lambda d: d.find_elements(By.ID, "jobs"), "the jobs list")
        link = browser.wait_for(
            driver,
            lambda d: [
                a
                for a in d.find_elements(By.CSS_SELECTOR, "a.job-link")
                if a.get_attribute("href").endswith(job_id)
            ],
            "the job's link",
        )
        shot(driver, "jobs")
        link[0].click()
        # The timeline polls itself (htmx) until the job has ended.
        browser.wait_for(
            driver, lambda d: text_of(d, "job-state") == "succeeded", "the job succeeded"
        )
        assert text_of(driver, "job-ended") != "—"
        assert text_of(driver, "served-model") == "sim"  # the model that made the result
        assert not driver.find_elements(By.ID, "cancel-job")
        shot(driver, "job")

        driver.get(f"{stack.api_url}/ui/batches")
        browser.wait_for(
            driver, lambda d: d.find_elements(By.CSS_SELECTOR, "a.batch-link"), "the batch"
        )
        driver.find_element(By.CSS_SELECTOR, f"a.batch-link[href$='{batch_id}']").click()
        browser.wait_for(
            driver, lambda d: text_of(d, "batch-status") == "completed", "the batch completed"
        )
        assert "3 of 3 ended" in text_of(driver, "batch-counts")
        shot(driver, "batch")
        driver.find_element(By.ID, "output-file").click()
        output = browser.wait_for(
            driver,
            lambda d: (
                "line-2" in d.find_element(By.TAG_NAME, "body").text
                and d.find_element(By.TAG_NAME, "body").text
            ),
            "the output file",
        )
        assert output.count('"custom_id"') == 3, output

        driver.get(f"{stack.api_url}/ui/pipeline")
        browser.wait_for(driver, lambda d: text_of(d, "admission-state") == "open", "the pipeline")
        # Polled every 3 s: the worker shows up once it has reported.
        browser.wait_for(driver, lambda d: "sim" in text_of(d, "workers"), "the worker")
        # The job and the batch's 3 lines, counted under succeeded (a link to them).
        counted = driver.find_elements(By.CSS_SELECTOR, "#job-counts a[href$='state=succeeded']")
        assert sum(int(a.text) for a in counted) >= 4, text_of(driver, "job-counts")
        shot(driver, "pipeline")
    assert stack.stop() == 0
