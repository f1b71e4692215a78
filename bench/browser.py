"""Headless chromium through its own chromedriver (Selenium; nothing is downloaded), for the
console's browser tests and its benchmark. None when chromium or chromedriver is missing."""
from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from typing import Any

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
MISSING = "no chromium + chromedriver installed (apt-get install chromium chromium-driver; .ci/run does)"


def available() -> bool:
    """Whether a browser can be started here."""
    return bool(CHROMIUM and DRIVER)


def launch(page_load_timeout: float = 30.0) -> Any:
    """A headless chromium WebDriver (the caller quits it)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    assert CHROMIUM and DRIVER, MISSING
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1280,900",
                 "--disable-extensions", "--no-first-run"):
        options.add_argument(flag)
    # chromium leaves its singleton socket folders in TMPDIR: give it one of its own, removed with the driver
    scratch = tempfile.mkdtemp(prefix="muninn-chromium-")
    driver = webdriver.Chrome(service=Service(DRIVER, env={**os.environ, "TMPDIR": scratch}), options=options)
    weakref.finalize(driver, shutil.rmtree, scratch, True)
    driver.set_page_load_timeout(page_load_timeout)
    return driver


def navigation_ms(driver: Any) -> float:
    """How long the browser took for the page it shows: request to load event (Navigation Timing)."""
    return float(driver.execute_script(
        "const n = performance.getEntriesByType('navigation')[0]; return n.loadEventEnd - n.startTime;"))
