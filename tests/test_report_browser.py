"""The report folder in a real browser (Selenium with Debian's ``chromium`` and ``chromium-driver``): at 1400×800 and
800×1000 the overview fits without scrolling sideways, headers sort and carry their help, a task's full table is one
click away, the model column stays in view, the reliability markers differ in size, and no request leaves the folder.

Skipped, with the reason, where selenium, chromium or chromedriver is missing (``make chromium`` installs both
packages where apt-get runs as root)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from lm_eval_probes.reports import build_report
from test_report_readability import DETECT_ROWS, GEN_ROWS, MC_ROWS, task_values, write_run

MODELS = (("SmolLM2-135M-Instruct", 0.2, 1), ("Gemma-3-270M", 0.6, 2), ("Qwen2.5-0.5B-Instruct", 1.0, 3))
"""Three models, names as long as the demo's."""


def browser_paths() -> tuple[str, str] | None:
    chromium = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
    driver = shutil.which("chromedriver")
    return (chromium, driver) if chromium and driver else None


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """A demo-sized report with figures: three models, six tasks (one noised twin, one detector, one generation)."""
    root = tmp_path_factory.mktemp("browser-runs")
    for model, shift, seed in MODELS:
        rng = np.random.default_rng(seed)
        write_run(root, model, {
            "probes_synth_recall": ("none", task_values(MC_ROWS, rng, shift)),
            "probes_synth_recall_noise_swap": ("none", task_values(MC_ROWS, rng, shift * 0.8)),
            "probes_synth_recall_detect": ("none", task_values(DETECT_ROWS, rng, shift)),
            "probes_synth_logic": ("none", task_values(MC_ROWS, rng, shift)),
            "probes_synth_arith": ("none", task_values(MC_ROWS, rng, shift)),
            "probes_synth_arith_gen": ("first-integer", task_values(GEN_ROWS, rng, shift)),
        })
    out = tmp_path_factory.mktemp("browser-site")
    build_report([root], out, n_resamples=100, seed=0, plots=True)
    return out


@pytest.fixture(scope="module")
def driver():
    pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install .[test])")
    paths = browser_paths()
    if paths is None:
        pytest.skip("chromium or chromedriver is not installed (Debian packages `chromium` and `chromium-driver`; "
                    "`make chromium` installs them where apt-get runs as root)")
    browser = headless_chromium(paths, extra=("--allow-file-access-from-files",), logs=True)
    try:
        yield browser
    finally:
        browser.quit()


def headless_chromium(paths: tuple[str, str], *, extra: tuple[str, ...] = (), logs: bool = False):
    """Headless Debian chromium driven by chromedriver (``paths``: :func:`browser_paths`), without the background
    networking this machine refuses; ``logs``: keep the performance and console logs."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = paths[0]
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                     "--disable-background-networking", "--disable-component-update", "--disable-sync", *extra):
        options.add_argument(argument)
    if logs:
        options.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
    return webdriver.Chrome(options=options, service=Service(executable_path=paths[1]))


def open_at(driver, page: Path, width: int, height: int) -> None:
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})
    driver.get_log("performance")  # drop what earlier pages logged
    driver.get(page.as_uri())


def requests(driver) -> list[str]:
    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message.get("method") == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls


LAYOUT = """
const box = document.querySelector('#overview').closest('.scroll');
const heads = Array.from(document.querySelectorAll('th'));
return {
  overview: [box.scrollWidth, box.clientWidth],
  page: [document.documentElement.scrollWidth, window.innerWidth],
  untitled: heads.filter(th => !(th.getAttribute('title') || '').trim()).map(th => th.textContent),
  robustness: (() => { const t = document.querySelector('#robustness'); if (!t) return null;
                       const b = t.closest('.scroll'); return [b.scrollWidth, b.clientWidth]; })(),
};
"""


@pytest.mark.parametrize(("width", "height"), [(1400, 800), (800, 1000)])
def test_the_page_in_chromium(site, driver, tmp_path, width, height):
    from selenium.webdriver.common.by import By

    page = site / "index.html"
    open_at(driver, page, width, height)
    layout = driver.execute_script(LAYOUT)
    assert layout["page"][0] <= layout["page"][1], layout  # the page itself never scrolls sideways
    assert layout["overview"][0] <= layout["overview"][1], layout  # the overview fits: no scrolling inside it
    if width >= 1400:  # the robustness table is not cut at its right edge
        assert layout["robustness"] is not None and layout["robustness"][0] <= layout["robustness"][1], layout
    assert layout["untitled"] == []  # every header carries its help
    driver.save_screenshot(str(tmp_path / f"top-{width}.png"))

    # sorting: the first task's column, highest first on the first click, then lowest first
    column = driver.find_element(By.XPATH, "//table[@id='overview']/thead/tr/th[5]")
    for expected, reverse in (("sorted-desc", True), ("sorted-asc", False)):
        driver.execute_script("arguments[0].click();", column)  # on the header, not its link
        order = driver.execute_script("return Array.from(document.querySelectorAll('#overview tbody tr')).map("
                                      "r => r.cells[4].getAttribute('data-sort'));")
        numbers = [float(x) for x in order]
        assert expected in column.get_attribute("class") and len(numbers) == len(MODELS)
        assert numbers == sorted(numbers, reverse=reverse)

    # a task's full table is one click away: its overview header links to it
    link = driver.find_element(By.CSS_SELECTOR, "#overview thead th a")
    target = link.get_attribute("href").split("#", 1)[1]
    link.click()
    assert driver.execute_script("return location.hash") == f"#{target}"
    top = driver.execute_script(f"return document.getElementById('{target}').getBoundingClientRect().top")
    assert -2 <= top < height

    # the model column stays in view while a wide task table scrolls sideways
    driver.find_element(By.CSS_SELECTOR, "label.full-view").click()
    sticky = driver.execute_script("""
      const table = document.querySelector('#task-table-1'); const box = table.closest('.scroll');
      box.scrollLeft = box.scrollWidth;
      const cell = table.tBodies[0].rows[0].cells[0];
      return [box.scrollLeft, cell.getBoundingClientRect().left - box.getBoundingClientRect().left];""")
    if width < 1400:
        assert sticky[0] > 0  # it did scroll
    assert abs(sticky[1]) <= 2, sticky
    driver.save_screenshot(str(tmp_path / f"task-{width}.png"))

    # every request stays inside the folder (the page, its figures as data: URLs, the files beside it)
    urls = requests(driver)
    assert urls and all(u.startswith(("data:", site.as_uri())) for u in urls), urls
    errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == []


def test_the_reliability_markers_differ_in_size():
    """Marker area ∝ documents in the bin: the fullest bin's marker is the largest, a bin with a tenth of its
    documents a tenth of its area (at least 4 pt²)."""
    from lm_eval_probes.reports.plots import RELIABILITY_MARKER_AREA, marker_areas

    areas = marker_areas(np.array([100, 10, 1, 0]))
    assert areas[0] == RELIABILITY_MARKER_AREA and areas[1] == pytest.approx(RELIABILITY_MARKER_AREA / 10)
    assert areas[2] == 4.0 and areas.max() / areas[2] >= 50


def test_the_folder_links_only_files_inside_it(site):
    """No remote asset: every src and href of the page is a fragment, a data: URL or a file in the folder."""
    import re

    page = (site / "index.html").read_text()
    links = re.findall(r'(?:src|href)="([^"]+)"', page)
    assert links
    for link in links:
        if link.startswith(("#", "data:")):
            continue
        assert "://" not in link and not link.startswith("//"), link
        assert (site / link).is_file(), link
