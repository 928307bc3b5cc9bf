"""The documents view's screenshots in ``docs/leaderboard.md``, in headless Chromium: the listing of a
multiple-choice task (synthetic runs of ``tests/document_fixtures.py``: three models, 40 documents with traces) and
one document, two models side by side with their choices and logit-lens grids, at 1400 and 800 px — from the runs
of ``make demo`` (``--runs results/demo/sweep/runs``: SmolLM2-135M-Instruct and Gemma-3-270M on the recall task, the
document the demo names first), or from the synthetic runs without ``--runs``:

    .venv/bin/python docs/documents_screenshots.py --runs results/demo/sweep/runs   # writes docs/leaderboard-document*.png
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
GRIDS = READY + " && document.querySelectorAll('#document-detail .lens-grid').length === 2"


def shoot(driver, page: Path, fragment: str, ready: str, path: Path, *, width: int, element: str) -> None:
    from selenium.webdriver.common.by import By

    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": width, "height": 2400, "deviceScaleFactor": 1, "mobile": False})
    driver.get("about:blank")
    driver.get(page.as_uri() + "#" + fragment)
    wait(driver, ready)
    overflow = driver.execute_script("return document.documentElement.scrollWidth - document.documentElement.clientWidth")
    if overflow > 0:
        raise SystemExit(f"{fragment} at {width} px: the page scrolls sideways by {overflow} px")
    driver.find_element(By.CSS_SELECTOR, element).screenshot(str(path))
    print(f"wrote {path}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=REPO / "docs", help="folder of the PNGs (default: docs/)")
    p.add_argument("--runs", type=Path, default=None,
                   help="lm_eval output folders of make demo (results/demo/sweep/runs) for the document's shots; "
                        "default: the synthetic runs")
    args = p.parse_args()

    from lm_eval_probes.cli.demo import first_document
    from lm_eval_probes.reports import build_report

    with tempfile.TemporaryDirectory() as folder:
        runs, site = Path(folder) / "runs", Path(folder) / "site"
        names = write_document_runs(runs, models=3, tasks=2, documents=40, prompt_length=20)
        build_report([runs], site, n_resamples=100, seed=0, plots=False)
        if args.runs is not None:
            real = Path(folder) / "real"
            report = build_report([args.runs], real, n_resamples=100, seed=0, plots=False)
            fragment = first_document(report)
            if fragment is None:
                raise SystemExit(f"{args.runs}: no run of probes_synth_recall with samples (make demo writes them)")
            document_page, fragment = real / "index.html", fragment.lstrip("#")
        else:
            document_page = site / "index.html"
            fragment = f"docs=synthetic_mc_00&filter=wrong&model={names[1]}&doc=5&b={names[2]}"
        driver = browser()
        try:
            shoot(driver, site / "index.html", "docs=synthetic_mc_00&filter=confident-wrong&threshold=0.6", READY,
                  args.out / "leaderboard-documents-1400.png", width=1400, element="#documents-view")
            for width in (1400, 800):
                shoot(driver, document_page, fragment, GRIDS, args.out / f"leaderboard-document-{width}.png",
                      width=width, element="#document-detail")
        finally:
            driver.quit()


if __name__ == "__main__":
    main()
