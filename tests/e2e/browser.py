"""A headless browser of a test's own: Debian's ``chromium`` driven through its
``chromedriver`` (apt-get install chromium chromium-driver, as .ci/run does) with Selenium.

Selenium is pointed at both binaries, so that its manager never looks for (or downloads) a
browser of its own.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from selenium import webdriver
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
WAIT_S = 60.0  # for a page to show what a step waits for (a loaded machine is slow)
T = TypeVar("T")


def binaries() -> tuple[str, str] | None:
    """(the browser, its driver), or None when either is missing."""
    browser = next((found for name in BROWSERS if (found := shutil.which(name))), None)
    driver = shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


def required() -> tuple[str, str]:
    """The binaries; without them the test is skipped on a developer's machine and fails
    in CI (``CI`` set), where .ci/run installs them."""
    found = binaries()
    if found is None:
        reason = (
            "no `chromium` and `chromedriver`: install Debian's "
            "(apt-get install chromium chromium-driver), as .ci/run does"
        )
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    return found


@contextlib.contextmanager
def chromium(downloads: Path) -> Iterator[WebDriver]:
    """A headless chromium, quit on the way out."""
    browser, driver = required()
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for argument in (
        "--headless=new",
        "--no-sandbox",  # root in a container has no user namespace to sandbox with
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1280,900",
        "--no-first-run",
        "--disable-extensions",
    ):
        options.add_argument(argument)
    options.add_experimental_option("prefs", {"download.default_directory": str(downloads)})
    session = webdriver.Chrome(options=options, service=Service(executable_path=driver))
    try:
        yield session
    finally:
        session.quit()


def wait_for(driver: WebDriver, condition: Callable[[WebDriver], T], what: str) -> T:
    """``condition``'s first truthy answer, polled until WAIT_S; on a timeout the
    failure names ``what`` and shows the page's text."""
    try:
        # A step's page is swapped under the condition (a redirect, htmx): an element it
        # found may be gone by the time it is read, so that is polled again, not a failure.
        ignored = (StaleElementReferenceException, NoSuchElementException)
        wait = WebDriverWait(driver, WAIT_S, poll_frequency=0.2, ignored_exceptions=ignored)
        return wait.until(condition)
    except Exception as exc:
        text = driver.find_element("tag name", "body").text[-2000:]
        where = driver.current_url
        raise AssertionError(f"{what}: not seen within {WAIT_S}s at {where}\n{text}") from exc
