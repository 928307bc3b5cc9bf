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
        tokens: Array.from(c.querySelectorAll('.tokens.response .token-text')).map(s => s.textContent),
        values: Array.from(c.querySelectorAll('.tokens.response .token-value')).map(s => Number(s.textContent)),
        prompt: Array.from(c.querySelectorAll('.tokens.prompt .token-text')).map(s => s.textContent),
        points: c.querySelectorAll('svg.trace-plot circle').length,
        tinted: Array.from(c.querySelectorAll('.tokens.response .token-text')).filter(s => s.style.background).length,
      }));""")
    assert [side["model"] for side in sides] == ["model-00", "model-01"]
    for side in sides:
        trace = next(line for line in lines[side["model"]] if str(line["doc_id"]) == doc)["trace"]
        assert side["tokens"] == trace["tokens"] and side["prompt"] == trace["sequence_tokens"]
        assert side["values"] == pytest.approx(trace["logprob"], rel=1e-3)  # the values written under the tokens
        assert side["points"] == len(trace["logprob"])
        assert side["tinted"] == len(trace["tokens"])
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


def test_multiple_choice_reads_as_choices(site, driver):  # noqa: F811
    """lm_eval's string log-likelihoods and target: each model's options with their log-likelihoods, the chosen and
    the gold one marked; the response column shows the chosen option's text."""
    from selenium.webdriver.support.ui import WebDriverWait

    root, out = site
    lines = samples(root, "synthetic_mc_00")
    line = lines["model-00"][5]
    assert isinstance(line["filtered_resps"][0][0], str) and isinstance(line["target"], str)  # as lm_eval writes them
    open_view(driver, out / "index.html", f"docs=synthetic_mc_00&model=model-00&doc={line['doc_id']}&b=model-01")
    WebDriverWait(driver, 20).until(lambda d: d.execute_script(
        "return document.querySelectorAll('#document-detail table.choices').length === 2;"))
    seen = driver.execute_script("""
      return Array.from(document.querySelectorAll('#document-detail .doc-model')).map(c => ({
        model: c.getAttribute('data-model'),
        rows: Array.from(c.querySelectorAll('table.choices tbody tr')).map(r => ({
          text: r.cells[0].textContent, loglik: Number(r.cells[1].textContent), chosen: r.classList.contains('chosen'),
          gold: r.classList.contains('gold')})),
        response: c.querySelector('dl.facts dd').textContent}));""")
    for side in seen:
        own = next(li for li in lines[side["model"]] if li["doc_id"] == line["doc_id"])
        options = [own["arguments"][f"gen_args_{k}"]["arg_1"] for k in range(len(own["arguments"]))]
        logliks = [float(resp[0]) for resp in own["filtered_resps"]]
        chosen = max(range(len(logliks)), key=lambda k: logliks[k])
        assert [row["text"] for row in side["rows"]] == options
        assert [row["loglik"] for row in side["rows"]] == pytest.approx(logliks, rel=1e-3)
        assert [row["chosen"] for row in side["rows"]] == [k == chosen for k in range(len(options))]
        assert [row["gold"] for row in side["rows"]] == [k == int(own["target"]) for k in range(len(options))]
        assert side["response"] == options[chosen]


def test_models_disagree_lists_the_documents_whose_chosen_options_differ(site, driver):  # noqa: F811
    root, out = site
    open_view(driver, out / "index.html", "docs=synthetic_mc_00&filter=disagree")
    lines = samples(root, "synthetic_mc_00")
    chosen: dict[str, set[int]] = {}
    for model_lines in lines.values():
        for line in model_lines:
            logliks = [float(resp[0]) for resp in line["filtered_resps"]]
            chosen.setdefault(str(line["doc_id"]), set()).add(max(range(len(logliks)), key=lambda k: logliks[k]))
    expected = {(model, doc) for model in lines for doc, picks in chosen.items() if len(picks) > 1}
    assert 0 < len(expected) < 3 * 14 and listed(driver) == expected


def test_a_right_b_wrong(site, driver):  # noqa: F811
    from selenium.webdriver.common.by import By

    root, out = site
    open_view(driver, out / "index.html", "docs=synthetic_mc_00&filter=a-right-b-wrong&model=model-02&b=model-00")
    lines = samples(root, "synthetic_mc_00")
    wrong_b = {line["doc_id"] for line in lines["model-00"] if line["acc"] == 0}
    expected = {("model-02", str(line["doc_id"])) for line in lines["model-02"] if line["acc"] == 1 and line["doc_id"] in wrong_b}
    assert expected and listed(driver) == expected
    assert driver.find_element(By.ID, "doc-b-box").is_displayed()
    assert "model-02 right, model-00 wrong" in driver.find_element(By.ID, "doc-count").text


def test_previous_next_and_the_keyboard(site, driver):  # noqa: F811
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    root, out = site
    lines = samples(root, "synthetic_gen_01")
    wrong = [str(line["doc_id"]) for line in lines["model-01"] if line["exact_match"] == 0]  # the listing's order
    assert len(wrong) >= 3
    open_view(driver, out / "index.html", f"docs=synthetic_gen_01&filter=wrong&model=model-01&doc={wrong[1]}")

    def at() -> str | None:
        return driver.execute_script("const m = location.hash.match(/[#&]doc=([^&]*)/); return m ? m[1] : null;")

    driver.find_element(By.CSS_SELECTOR, "#document-detail button.next").click()
    assert at() == wrong[2]
    driver.find_element(By.CSS_SELECTOR, "#document-detail button.previous").click()
    assert at() == wrong[1]
    body = driver.find_element(By.TAG_NAME, "body")
    body.send_keys("k")
    assert at() == wrong[0]
    assert driver.find_element(By.CSS_SELECTOR, "#document-detail button.previous").get_attribute("disabled")
    body.send_keys("j")
    assert at() == wrong[1]
    body.send_keys(Keys.ESCAPE)
    assert at() is None and not driver.find_element(By.ID, "document-detail").is_displayed()
    row = driver.find_element(By.CSS_SELECTOR, f"#documents-table tbody tr[data-doc-id='{wrong[2]}']")
    row.send_keys(Keys.ENTER)  # a focused row opens with the keyboard
    WebDriverWait(driver, 10).until(lambda d: at() == wrong[2])


def test_search_finds_a_gold_option_by_its_text(site, driver):  # noqa: F811
    root, out = site
    open_view(driver, out / "index.html", "docs=synthetic_mc_00&q=unknown")
    lines = samples(root, "synthetic_mc_00")
    expected = set()
    for model, model_lines in lines.items():
        for line in model_lines:
            options = [line["arguments"][f"gen_args_{k}"]["arg_1"] for k in range(len(line["arguments"]))]
            logliks = [float(resp[0]) for resp in line["filtered_resps"]]
            chosen = options[max(range(len(logliks)), key=lambda k: logliks[k])]
            text = " ".join([line["arguments"]["gen_args_0"]["arg_0"], options[int(line["target"])], chosen]).lower()
            if "unknown" in text:
                expected.add((model, str(line["doc_id"])))
    assert expected and listed(driver) == expected


def test_a_document_loads_only_its_blocks_traces(driver, tmp_path, monkeypatch):  # noqa: F811
    """The traces are written in blocks of documents; opening a document adds only its block's file to the page."""
    from selenium.webdriver.support.ui import WebDriverWait

    from lm_eval_probes.reports import documents

    monkeypatch.setattr(documents, "TRACE_DOCUMENTS", 5)
    write_document_runs(tmp_path / "runs", models=2, tasks=1, documents=14)
    build_report([tmp_path / "runs"], tmp_path / "site", n_resamples=10, seed=0, plots=False)
    written = sorted(p.name for p in (tmp_path / "site" / "documents").glob("*.traces-*.js"))
    assert written == [f"001-synthetic_mc_00.traces-{k:03d}.js" for k in range(3)]
    open_view(driver, tmp_path / "site" / "index.html", "docs=synthetic_mc_00&model=model-00&doc=12&b=model-01")
    WebDriverWait(driver, 20).until(lambda d: d.execute_script(
        "return document.querySelectorAll('#document-detail .lens-grid').length === 2;"))
    loaded = driver.execute_script(
        "return Array.from(document.querySelectorAll('script[src]')).map(s => s.getAttribute('src'));")
    assert [src for src in loaded if ".traces" in src] == ["documents/001-synthetic_mc_00.traces-002.js"]


def test_a_report_written_again_leaves_no_stale_documents_file(tmp_path):
    write_document_runs(tmp_path / "runs", models=1, tasks=2, documents=3)
    site = tmp_path / "site"
    (site / "documents").mkdir(parents=True)
    (site / "documents" / "001-synthetic_mc_00.traces.js").write_text("window.LEP_TRACES = {};\n")  # an older layout
    build_report([tmp_path / "runs"], site, n_resamples=10, seed=0, plots=False)
    names = sorted(p.name for p in (site / "documents").iterdir())
    assert len(names) == 4 and all(name.endswith((".traces-000.js", "_gen_01.js", "_mc_00.js")) for name in names)


def test_a_long_response_scrolls_inside_its_grid_at_800_px(driver, tmp_path):  # noqa: F811
    """60 response tokens × 13 layers: the grid scrolls sideways inside its box; the page does not."""
    import numpy as np

    from document_fixtures import lens_of, task_lines, write_document_run

    rng = np.random.default_rng(0)
    for name in ("model-a", "model-b"):
        lines = task_lines("synthetic_gen_00", "gen", 3, 0.5, seed=len(name))
        tokens = [" w" + str(k) for k in range(60)]
        logprob = [-0.5] * 60
        lines[1]["trace"] = {"tokens": tokens, "logprob": logprob, **lens_of(rng, tokens, [0.6] * 60)}
        write_document_run(tmp_path / "runs", name, {"synthetic_gen_00": lines})
    build_report([tmp_path / "runs"], tmp_path / "site", n_resamples=10, seed=0, plots=False)
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": 800, "height": 1000, "deviceScaleFactor": 1, "mobile": False})
    try:
        open_view(driver, tmp_path / "site" / "index.html", "docs=synthetic_gen_00&model=model-a&doc=1&b=model-b")
        from selenium.webdriver.support.ui import WebDriverWait

        WebDriverWait(driver, 20).until(lambda d: d.execute_script(
            "return document.querySelectorAll('#document-detail .lens-grid').length === 2;"))
        seen = driver.execute_script("""
          return {page: [document.documentElement.scrollWidth, document.documentElement.clientWidth],
                  cells: document.querySelectorAll('[data-lens-cell]').length,
                  boxes: Array.from(document.querySelectorAll('.lens-scroll')).map(b =>
                    [b.scrollWidth, b.clientWidth, b.getBoundingClientRect().right])};""")
    finally:
        driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
    assert seen["page"][0] <= seen["page"][1] and seen["cells"] == 2 * 13 * 60
    for scroll_width, client_width, right in seen["boxes"]:
        assert scroll_width > client_width and right <= seen["page"][1]
