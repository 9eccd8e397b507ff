"""The verdict matrix's HTML page in a real headless browser: the filter hides rows, a marked cell
leads to its reason (CONF-912).

Runs Debian's ``chromium`` through its ``chromedriver`` with Selenium; ``.ci/run`` installs both.
Where either is missing the test is skipped, saying which.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.test_verdicts import IMPLEMENTATION, TESTS

rule = pytest.mark.rule

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")


def fully_installed(*packages: str) -> bool:
    """Whether Debian's packages are installed and set up (not still being unpacked by a running apt);
    True where there is no dpkg to ask."""
    if shutil.which("dpkg-query") is None:
        return True
    for package in packages:
        status = subprocess.run(["dpkg-query", "-W", "-f=${Status}", package], capture_output=True, text=True)
        if status.stdout.strip() != "install ok installed":
            return False
    return True


@pytest.fixture
def browser() -> Iterator[Any]:
    """A headless Chromium driven by Selenium, or a skip saying what is missing."""
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (the test extra has it)")
    if CHROMIUM is None or DRIVER is None or not fully_installed("chromium", "chromium-driver"):
        pytest.skip("no chromium and chromedriver here: `apt-get install chromium chromium-driver` (.ci/run does)")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=DRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


@rule("CONF-912")
def test_the_verdict_page_filters_its_rows_and_each_marked_cell_leads_to_its_reason(
    tmp_path: Path, browser: Any
) -> None:
    from selenium.webdriver.common.by import By

    from kvref.cli.main import main
    from kvref_conformance.verdicts import verdict_document, write_verdicts

    write_verdicts(tmp_path, [verdict_document(IMPLEMENTATION, TESTS, "ci")])
    assert main(["report", "--verdicts", str(tmp_path)]) == 0
    browser.get((tmp_path / "index.html").as_uri())

    def shown() -> list[str]:
        rows = browser.find_elements(By.CSS_SELECTOR, "tbody tr")
        return [r.find_element(By.CSS_SELECTOR, "td.rule").text for r in rows if r.is_displayed()]

    assert shown() == ["POOL-105", "POOL-106", "POOL-107", "POOL-108", "PFX-315"], shown()
    box = browser.find_element(By.ID, "filter")
    box.send_keys("POOL-10")
    assert shown() == ["POOL-105", "POOL-106", "POOL-107", "POOL-108"], shown()
    box.send_keys(" reserve")  # every word must appear: POOL-107's text speaks of none
    assert len(shown()) < 4, shown()
    box.clear()
    box.send_keys("x")  # a key the filter hears; then back to every row
    box.clear()
    box.send_keys(" ")
    assert len(shown()) == 5, shown()
    link = browser.find_element(By.CSS_SELECTOR, "td.deviation a")
    link.click()
    assert browser.current_url.endswith("#" + link.get_attribute("href").rsplit("#", 1)[1])
    reason = browser.find_element(By.ID, browser.current_url.rsplit("#", 1)[1])
    assert "scatter release" in reason.text and "upstream" in reason.text, reason.text
