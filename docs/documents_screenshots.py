"""The documents view's screenshots in ``docs/leaderboard.md``, made from synthetic runs (three models, a
multiple-choice and a generation task, 40 documents with traces: ``tests/document_fixtures.py``) in headless Chromium:

    .venv/bin/python docs/documents_screenshots.py            # writes docs/leaderboard-documents-1400.png, …-document-1400.png
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "benchmarks"))

from document_fixtures import write_document_runs  # noqa: E402
from documents_view import browser, wait  # noqa: E402

READY = "return !document.getElementById('documents-view').hidden && document.getElementById('documents-view').dataset.ready"


def shoot(driver, page: Path, fragment: str, ready: str, path: Path) -> None:
    from selenium.webdriver.common.by import By

    driver.get("about:blank")
    driver.get(page.as_uri() + "#" + fragment)
    wait(driver, ready)
    driver.find_element(By.ID, "documents-view").screenshot(str(path))
    print(f"wrote {path}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=REPO / "docs", help="folder of the PNGs (default: docs/)")
    args = p.parse_args()

    from lm_eval_probes.reports import build_report

    with tempfile.TemporaryDirectory() as folder:
        runs, site = Path(folder) / "runs", Path(folder) / "site"
        names = write_document_runs(runs, models=3, tasks=2, documents=40, prompt_length=20)
        build_report([runs], site, n_resamples=100, seed=0, plots=False)
        driver = browser()
        try:
            driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                                   {"width": 1400, "height": 2400, "deviceScaleFactor": 1, "mobile": False})
            page = site / "index.html"
            shoot(driver, page, "docs=synthetic_mc_00&filter=confident-wrong&threshold=0.6", READY,
                  args.out / "leaderboard-documents-1400.png")
            shoot(driver, page, f"docs=synthetic_gen_01&filter=wrong&model={names[1]}&doc=5&b={names[2]}",
                  READY + " && document.querySelectorAll('#document-detail .trace svg').length === 2;",
                  args.out / "leaderboard-document-1400.png")
        finally:
            driver.quit()


if __name__ == "__main__":
    main()
