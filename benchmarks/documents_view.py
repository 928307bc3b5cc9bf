"""How fast the report page renders with the documents view at full size: M models × T tasks × N documents with
per-token traces (synthetic samples shaped like ``hf-probes``' with ``probe_traces=true``: ``tests/document_fixtures.py``).

    python benchmarks/documents_view.py --models 10 --tasks 10 --documents 500 --out /tmp/docs-bench

Writes the runs and the report into ``--out``, then opens ``index.html`` from ``file://`` in headless Chromium (Debian's
``chromium`` and ``chromedriver``, through Selenium) ``--repeats`` times and prints, as JSON: the files' sizes, the
first render of the page (first contentful paint, DOMContentLoaded and the load event, from the browser's own
performance entries), the time from opening a task's documents view to its listed rows (its script file loaded and
parsed, the first 500 pairs drawn) and from opening one document to its two traces drawn (its block's traces file
loaded: the traces of 50 documents, every model's, with their logit-lens grids). The first render reads
no documents file: a task's is added when its view opens.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from document_fixtures import write_document_runs  # noqa: E402


def browser():
    from test_report_browser import browser_paths, headless_chromium

    paths = browser_paths()
    if paths is None:
        raise SystemExit("chromium and chromedriver are needed (Debian packages chromium, chromium-driver)")
    return headless_chromium(paths)


FIRST_RENDER = """
const nav = performance.getEntriesByType('navigation')[0];
const paint = performance.getEntriesByType('paint').find(p => p.name === 'first-contentful-paint');
return {fcp_ms: paint ? paint.startTime : null, dom_content_loaded_ms: nav.domContentLoadedEventEnd,
        load_ms: nav.loadEventEnd};
"""


def wait(driver, script: str, timeout: float = 60.0) -> float:
    """Seconds until ``script`` returns true (polled every 5 ms)."""
    start = time.perf_counter()
    while not driver.execute_script(script):
        if time.perf_counter() - start > timeout:
            raise TimeoutError(script)
        time.sleep(0.005)
    return time.perf_counter() - start


def measure(page: Path, task: str, repeats: int) -> dict[str, object]:
    driver = browser()
    runs: list[dict[str, float]] = []
    try:
        for _ in range(repeats):
            driver.get("about:blank")
            driver.get(page.as_uri())
            wait(driver, "return document.readyState === 'complete';")
            time.sleep(0.2)  # the paint entries are written after the load event
            timing = driver.execute_script(FIRST_RENDER)
            driver.execute_script(f"location.hash = {json.dumps('docs=' + task)};")
            timing["documents_view_s"] = wait(
                driver, "const v = document.getElementById('documents-view');"
                        "return v.getAttribute('data-ready') && document.querySelectorAll('#documents-table tbody tr').length > 0;")
            timing["listed_pairs"] = driver.execute_script("return document.querySelectorAll('#documents-table tbody tr').length;")
            driver.execute_script("document.querySelector('#documents-table tbody tr').click();")
            timing["document_traces_s"] = wait(
                driver, "return document.querySelectorAll('#document-detail .trace svg').length === 2;")
            runs.append(timing)
    finally:
        driver.quit()
    keys = [k for k in runs[0] if k != "listed_pairs"]
    return {"repeats": runs, "median": {k: statistics.median(r[k] for r in runs if r[k] is not None) for k in keys},
            "listed_pairs": runs[0]["listed_pairs"]}


def sizes(out: Path) -> dict[str, object]:
    documents = sorted((out / "documents").glob("*.js"))
    lists = [p for p in documents if ".traces" not in p.name]
    traces = [p for p in documents if ".traces" in p.name]
    mib = 1024 * 1024
    return {"index_html_mib": round((out / "index.html").stat().st_size / mib, 2),
            "documents_file_mib_each": round(max(p.stat().st_size for p in lists) / mib, 2),
            "traces_file_mib_each": round(max(p.stat().st_size for p in traces) / mib, 2) if traces else 0,
            "traces_of_a_task_mib": round(max(sum(p.stat().st_size for p in traces if p.name.startswith(prefix))
                                              for prefix in {p.name.split(".")[0] for p in traces}) / mib, 1) if traces else 0,
            "documents_folder_mib": round(sum(p.stat().st_size for p in documents) / mib, 1),
            "files": len(documents)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", type=int, default=10)
    p.add_argument("--tasks", type=int, default=10)
    p.add_argument("--documents", type=int, default=500)
    p.add_argument("--prompt-length", type=int, default=64, help="prompt tokens per document (its margin trace)")
    p.add_argument("--resamples", type=int, default=100, help="the report's bootstrap resamples (not measured here)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()

    from lm_eval_probes.reports import build_report

    runs, site = args.out / "runs", args.out / "site"
    if not runs.exists():
        write_document_runs(runs, args.models, args.tasks, args.documents, prompt_length=args.prompt_length)
    start = time.perf_counter()
    build_report([runs], site, n_resamples=args.resamples, seed=0, plots=False)
    built = time.perf_counter() - start
    task = "synthetic_mc_00"  # the first task document_fixtures writes (multiple choice)
    print(json.dumps({"models": args.models, "tasks": args.tasks, "documents": args.documents,
                      "report_build_s": round(built, 1), "sizes": sizes(site),
                      "browser": measure(site / "index.html", task, args.repeats)}, indent=2))


if __name__ == "__main__":
    main()
