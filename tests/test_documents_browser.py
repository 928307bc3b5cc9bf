"""The documents view in headless Chromium from ``file://`` (Selenium, as ``test_report_browser.py``): deep links list
exactly the (model, document) pairs the samples say, the confident-and-wrong filter with its threshold, one document's
two models side by side with their traces, and document text that stays text."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from document_fixtures import MARKUP, write_document_runs
from lm_eval_probes.reports import build_report
from lm_eval_probes.reports.documents import task_documents
from lm_eval_probes.reports.reading import read_runs
from test_report_browser import driver  # noqa: F401  (the fixture)

MARKUP_DOC = 3


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("document-runs")
    write_document_runs(root, models=3, tasks=2, documents=14, markup_doc=MARKUP_DOC)
    out = tmp_path_factory.mktemp("document-site")
    build_report([root], out, n_resamples=50, seed=0, plots=False)
    return root, out


def samples(root: Path, task: str) -> dict[str, list[dict]]:
    return {path.parent.name: [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
            for path in sorted(root.glob(f"*/samples_{task}_*.jsonl"))}


def open_view(driver, page: Path, fragment: str) -> None:  # noqa: F811
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get("about:blank")
    driver.get(page.as_uri() + "#" + fragment)
    WebDriverWait(driver, 20).until(lambda d: d.execute_script(
        "const v = document.getElementById('documents-view'); return v && !v.hidden && v.getAttribute('data-ready');"))


def listed(driver) -> set[tuple[str, str]]:  # noqa: F811
    return {tuple(pair) for pair in driver.execute_script(
        "return Array.from(document.querySelectorAll('#documents-table tbody tr')).map("
        "r => [r.getAttribute('data-model'), r.getAttribute('data-doc-id')]);")}


@pytest.mark.parametrize(("task", "metric"), [("synthetic_mc_00", "acc"), ("synthetic_gen_01", "exact_match")])
def test_a_deep_link_lists_exactly_the_wrong_pairs_of_every_model(site, driver, task, metric):  # noqa: F811
    root, out = site
    open_view(driver, out / "index.html", f"docs={task}&filter=wrong")
    expected = {(model, str(line["doc_id"])) for model, lines in samples(root, task).items()
                for line in lines if line[metric] == 0}
    assert expected and listed(driver) == expected


def test_confident_and_wrong_with_its_threshold_shown(site, driver):  # noqa: F811
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    root, out = site
    open_view(driver, out / "index.html", "docs=synthetic_mc_00")
    Select(driver.find_element(By.ID, "doc-filter")).select_by_value("confident-wrong")
    box = driver.find_element(By.ID, "doc-threshold")
    assert box.is_displayed() and float(box.get_attribute("value")) == 0.8  # the default, shown
    driver.execute_script("arguments[0].value = '0.5'; arguments[0].dispatchEvent(new Event('change'));", box)
    assert "filter=confident-wrong" in driver.current_url and "threshold=0.5" in driver.current_url
    expected = {(model, str(line["doc_id"])) for model, lines in samples(root, "synthetic_mc_00").items()
                for line in lines if line["acc"] == 0 and line["confidence"] >= 0.5}
    assert expected and listed(driver) == expected
    assert "confidence ≥ 0.5" in driver.find_element(By.ID, "doc-count").text


def test_one_document_side_by_side_with_its_traces(site, driver):  # noqa: F811
    from selenium.webdriver.support.ui import WebDriverWait

    root, out = site
    lines = samples(root, "synthetic_mc_00")
    wrong = next(line for line in lines["model-00"] if line["acc"] == 0)
    doc = str(wrong["doc_id"])
    open_view(driver, out / "index.html", f"docs=synthetic_mc_00&filter=wrong&model=model-00&doc={doc}")
    assert listed(driver) == {("model-00", str(line["doc_id"])) for line in lines["model-00"] if line["acc"] == 0}
    WebDriverWait(driver, 20).until(lambda d: d.execute_script(
        "return document.querySelectorAll('#document-detail .doc-model .trace svg').length === 2;"))
    sides = driver.execute_script("""
      return Array.from(document.querySelectorAll('#document-detail .doc-model')).map(c => ({
        model: c.getAttribute('data-model'),
        tokens: Array.from(c.querySelectorAll('.tokens')[0].children).map(s => s.textContent),
        prompt: Array.from(c.querySelectorAll('.tokens')[1].children).map(s => s.textContent),
        points: c.querySelector('polyline').getAttribute('points').split(' ').length,
        tinted: Array.from(c.querySelectorAll('.tokens')[0].children).filter(s => s.style.background !== 'transparent').length,
      }));""")
    assert [side["model"] for side in sides] == ["model-00", "model-01"]
    for side in sides:
        trace = next(line for line in lines[side["model"]] if str(line["doc_id"]) == doc)["trace"]
        assert side["tokens"] == trace["tokens"] and side["prompt"] == trace["sequence_tokens"]
        assert side["points"] == len(trace["logprob"])
        assert side["tinted"] == len(trace["tokens"]) or len(set(trace["logprob"])) == 1
    driver.save_screenshot(str(out / "document.png"))


def test_document_text_stays_text(site, driver):  # noqa: F811
    from selenium.webdriver.support.ui import WebDriverWait

    _, out = site
    open_view(driver, out / "index.html", f"docs=synthetic_gen_01&model=model-00&doc={MARKUP_DOC}")
    WebDriverWait(driver, 20).until(lambda d: d.execute_script(
        "return document.querySelectorAll('#document-detail .trace svg').length === 2;"))
    seen = driver.execute_script("""
      return {injected: window.__injected === undefined ? null : window.__injected,
              prompt: document.querySelector('#document-detail pre.prompt').textContent,
              images: document.querySelectorAll('#documents-view img').length,
              cells: Array.from(document.querySelectorAll('#documents-table tbody tr[data-doc-id="3"] td'))
                         .map(td => td.textContent),
              tokens: document.querySelector('#document-detail .tokens').textContent};""")
    assert seen["injected"] is None and seen["images"] == 0
    assert MARKUP in seen["prompt"] and any(MARKUP in cell for cell in seen["cells"]) and seen["tokens"].startswith(MARKUP)
    errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == []


def test_sorting_a_column(site, driver):  # noqa: F811
    from selenium.webdriver.common.by import By

    _, out = site
    open_view(driver, out / "index.html", "docs=synthetic_mc_00")
    header = driver.find_element(By.CSS_SELECTOR, "#documents-table th[data-column='confidence']")
    header.click()
    values = driver.execute_script(
        "const i = Array.from(document.querySelectorAll('#documents-table th')).findIndex(th => "
        "th.getAttribute('data-column') === 'confidence');"
        "return Array.from(document.querySelectorAll('#documents-table tbody tr')).map(r => Number(r.cells[i].textContent));")
    assert len(values) == 3 * 14 and values == sorted(values, reverse=True)


def test_the_documents_data_hold_every_pair(site):
    root, _ = site
    models = read_runs([root])
    documents, traces = task_documents(models, "synthetic_mc_00")
    assert len(documents["pairs"]) == 3 * 14 and len(traces) == 3 * 14
    assert [c["name"] for c in documents["columns"]] == ["tcb_log10", "bte_energy", "confidence", "response_tokens"]
