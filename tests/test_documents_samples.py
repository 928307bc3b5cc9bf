"""The documents view, the Parquet details and the Every Eval Ever instance files read multiple choice from samples
that lm_eval itself wrote (``EvaluationTracker``: log-likelihoods ``"-3.71"`` and targets ``"1"`` as strings): the
chosen option's text, the gold option's text, each option's log-likelihood. The page, in headless Chromium at 1400
and 800 px, draws one document's choices, its logit-lens grid (one cell per kept layer and response position) and
the grid's legend for both models side by side."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from document_fixtures import write_lm_eval_runs
from loader_fixtures import write_data_dir
from test_report_browser import driver  # noqa: F401  (the fixture)
from test_report_publish import every_eval_ever_schemas
from lm_eval_probes.reports import build_report
from lm_eval_probes.reports.choices import chosen_index, gold_indices, gold_text, option_logliks, response_text
from lm_eval_probes.reports.documents import task_documents
from lm_eval_probes.reports.reading import read_runs

MC, GEN = "probes_synth_logic", "probes_synth_arith_gen"
LIMIT = 8


@pytest.fixture(scope="module")
def runs(tiny_model_dir, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("lm-eval-runs")
    data = write_data_dir(root / "data", n=LIMIT)
    write_lm_eval_runs(root / "runs", {"llama": tiny_model_dir("llama"), "gpt2": tiny_model_dir("gpt2")}, data,
                       tasks=[MC, GEN], limit=LIMIT, probes="tcb+bte+omega", probe_bte_profile="full")
    return root / "runs"


def lines_of(runs: Path, task: str) -> dict[str, list[dict]]:
    out = {}
    for path in sorted(runs.rglob(f"samples_{task}_*.jsonl")):
        label = path.relative_to(runs).parts[0]
        out[label] = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    return out


def label_of(model_name: str) -> str:
    """A run's label from the model's name (its tiny model's folder)."""
    return "gpt2" if "gpt2" in model_name else "llama"


def test_lm_eval_writes_log_likelihoods_and_targets_as_strings(runs):
    """What the fixes below are about: the samples hold lm_eval's strings, not the numbers."""
    for lines in lines_of(runs, MC).values():
        for line in lines:
            assert isinstance(line["target"], str) and line["target"].isdigit()
            assert all(isinstance(resp[0], str) and isinstance(resp[1], str) for resp in line["filtered_resps"])


def test_a_samples_line_reads_as_its_options(runs):
    for lines in lines_of(runs, MC).values():
        for line in lines:
            texts = [line["arguments"][f"gen_args_{k}"]["arg_1"] for k in range(len(line["arguments"]))]
            logliks = [float(resp[0]) for resp in line["filtered_resps"]]
            best = max(range(len(logliks)), key=lambda k: logliks[k])
            assert option_logliks(line) == logliks and chosen_index(line, "acc") == best
            assert response_text(line, "acc") == texts[best]
            assert gold_indices(line) == [int(line["target"])] and gold_text(line) == texts[int(line["target"])]
            assert line["acc"] == float(best == int(line["target"]))  # lm_eval's own verdict agrees
    for lines in lines_of(runs, GEN).values():
        for line in lines:
            assert option_logliks(line) is None and gold_indices(line) is None
            assert response_text(line, "exact_match") == line["filtered_resps"][0] and gold_text(line) == line["target"]


def test_the_documents_view_shows_choices_never_raw_pairs(runs):
    models = read_runs([runs])
    documents, traces = task_documents(models, MC)
    lines = lines_of(runs, MC)
    by_doc = {d["id"]: d for d in documents["documents"]}
    assert len(documents["pairs"]) == 2 * LIMIT and len(traces) == 2 * LIMIT
    for m, d, response, correct, _, _, traced, choices in documents["pairs"]:
        doc = documents["documents"][d]
        line = next(li for li in lines[label_of(documents["models"][m])] if str(li["doc_id"]) == doc["id"])
        assert response in doc["options"] and not response.startswith("[")
        assert doc["gold"] == doc["options"][int(line["target"])] and doc["gold_options"] == [int(line["target"])]
        assert choices["logliks"] == pytest.approx([float(r[0]) for r in line["filtered_resps"]], rel=1e-5)
        assert doc["options"][choices["chosen"]] == response
        assert correct == int(line["acc"]) == int(choices["chosen"] in doc["gold_options"]) and traced == 1
    # the "models disagree" filter compares the responses: agreeing models give the same option's text
    responses: dict[int, set[str]] = {}
    for m, d, response, *_ in documents["pairs"]:
        responses.setdefault(d, set()).add(response)
    assert all(len(r) <= len(by_doc[documents["documents"][d]["id"]]["options"]) for d, r in responses.items())
    assert any(len(r) == 1 for r in responses.values())
    generated, _ = task_documents(models, GEN)
    assert all(pair[7] is None and isinstance(pair[2], str) for pair in generated["pairs"])


def test_the_details_and_instance_files_carry_the_options(runs, tmp_path):
    import pyarrow.parquet as pq

    build_report([runs], tmp_path, n_resamples=20, seed=0, plots=False)
    lines = lines_of(runs, MC)
    for label in lines:
        (path,) = (tmp_path / "details").glob(f"*tiny-{label}*/samples_{MC}.parquet")
        rows = {row["doc_id"]: row for row in pq.read_table(path).to_pylist()}
        for line in lines[label]:
            row = rows[str(line["doc_id"])]
            texts = row["choices"]
            assert row["choice_logliks"] == pytest.approx([float(r[0]) for r in line["filtered_resps"]])
            assert row["gold"] == texts[int(line["target"])] and row["target"] == line["target"]
            assert row["response"] == texts[max(range(len(texts)), key=lambda k: row["choice_logliks"][k])]
    instances = [json.loads(text) for path in (tmp_path / "every_eval_ever").rglob("*_samples.jsonl")
                 for text in path.read_text().splitlines()]
    multiple_choice = [i for i in instances if i["input"]["choices"]]
    assert len(multiple_choice) == 2 * LIMIT
    for record in multiple_choice:
        choices = record["input"]["choices"]
        assert record["input"]["reference"][0] in choices and record["output"]["raw"][0] in choices
        assert record["evaluation"]["is_correct"] == (record["output"]["raw"][0] in record["input"]["reference"])
        assert not math.isnan(record["evaluation"]["score"])
    schemas = every_eval_ever_schemas()
    if schemas is not None:  # the every-eval-ever wheel at hand: every instance validates
        import jsonschema

        validator = jsonschema.Draft7Validator(schemas[1])
        for record in instances:
            validator.validate(record)


@pytest.fixture(scope="module")
def site(runs, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    build_report([runs], out, n_resamples=20, seed=0, plots=False)
    return out


@pytest.mark.parametrize("width", [1400, 800])
@pytest.mark.parametrize("task", [MC, GEN])
def test_one_document_draws_its_choices_and_lens_grids(runs, site, driver, width, task):  # noqa: F811
    """``#docs=<task>&model=<A>&doc=<id>&b=<B>``: for each model one ``data-lens-cell="<layer>,<position>"`` per kept
    layer and response position of its trace, coloured by the lens probability of the emitted token on the one 0–1
    scale of its legend, the top token written where it is another one, the commitment layer outlined; for multiple
    choice every option with its log-likelihood, chosen and gold marked; at 800 px the grid scrolls inside its box,
    never the page."""
    from matplotlib import colormaps
    from selenium.webdriver.support.ui import WebDriverWait

    viridis = colormaps["viridis"]
    models = read_runs([runs])
    names = sorted(m.name for m in models)
    lines = lines_of(runs, task)
    doc = 3
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": width, "height": 1200, "deviceScaleFactor": 1, "mobile": False})
    driver.get("about:blank")
    driver.get((site / "index.html").as_uri() + f"#docs={task}&model={names[0]}&doc={doc}&b={names[1]}")
    WebDriverWait(driver, 30).until(lambda d: d.execute_script(
        "return document.querySelectorAll('#document-detail .doc-model .lens-grid').length === 2;"))
    seen = driver.execute_script("""
      return {page: [document.documentElement.scrollWidth, document.documentElement.clientWidth],
        sides: Array.from(document.querySelectorAll('#document-detail .doc-model')).map(c => ({
          model: c.getAttribute('data-model'),
          cells: Array.from(c.querySelectorAll('[data-lens-cell]')).map(e => ({
            at: e.getAttribute('data-lens-cell'), text: e.textContent, colour: getComputedStyle(e).backgroundColor,
            commit: e.classList.contains('commit'), title: e.getAttribute('title')})),
          legend: Array.from(c.querySelectorAll('.legend')[0].querySelectorAll('.legend-ticks span')).map(s => s.textContent),
          legendName: c.querySelector('.legend .legend-name').textContent,
          box: (b => [b.scrollWidth, b.clientWidth, b.getBoundingClientRect().right])(c.querySelector('.lens-scroll')),
          choices: Array.from(c.querySelectorAll('table.choices tbody tr')).map(r => ({
            text: r.cells[0].textContent, loglik: Number(r.cells[1].textContent),
            chosen: r.classList.contains('chosen'), gold: r.classList.contains('gold')}))}))};""")
    assert seen["page"][0] <= seen["page"][1]  # the page never scrolls sideways
    prompt = next(iter(lines.values()))[doc]["arguments"]["gen_args_0"]["arg_0"]
    shown = driver.execute_script("""
      const q = document.querySelector('#document-detail pre.question'), f = document.querySelector('#document-detail details.fewshot');
      const box = q.getBoundingClientRect();
      return {question: q.textContent, visible: box.height > 0 && box.bottom <= window.innerHeight + 2000,
              folded: f ? [f.open, f.querySelector('pre').textContent] : null};""")
    if "\n\n" in prompt:  # a few-shot prompt: its examples folded, the question itself shown whole
        assert shown["folded"] == [False, prompt[: prompt.rindex("\n\n") + 2]]
        assert shown["question"] == prompt[prompt.rindex("\n\n") + 2:] and shown["visible"]
    else:
        assert shown["folded"] is None and shown["question"] == prompt
    assert [side["model"] for side in seen["sides"]] == names[:2]
    for side in seen["sides"]:
        line = next(li for li in lines[label_of(side["model"])] if li["doc_id"] == doc)
        trace = line["trace"]
        lens, layers, n = trace["lens"], trace["lens_layers"], len(trace["tokens"])
        assert sorted(cell["at"] for cell in side["cells"]) == sorted(f"{l},{j}" for l in layers for j in range(n))
        assert side["legendName"].startswith("lens P(emitted token)") and side["legend"] == ["0", "0.25", "0.5", "0.75", "1"]
        assert side["box"][2] <= seen["page"][1]  # the grid's box stays inside the page
        for cell in side["cells"]:
            layer, position = (int(v) for v in cell["at"].split(","))
            row = layers.index(layer)
            top = lens["top_token"][row][position]
            other = lens["top_prob"][row][position] != lens["emitted_prob"][row][position]
            name = trace["lens_tokens"][str(top)]
            assert cell["text"] == (name if other and name != trace["tokens"][position] else "")
            assert cell["commit"] == (lens["commit_layer"][position] == layer)
            p = lens["emitted_prob"][row][position]
            assert float(cell["title"].split(") = ")[1].split(";")[0]) == pytest.approx(p, rel=1e-3)  # the value on hover
            rgb = [int(v) for v in cell["colour"].removeprefix("rgb(").removesuffix(")").split(",")]
            assert rgb == pytest.approx([255 * c for c in viridis(p)[:3]], abs=8)  # viridis, 0 → 1
        if task == MC:
            texts = [line["arguments"][f"gen_args_{k}"]["arg_1"] for k in range(len(line["arguments"]))]
            logliks = [float(resp[0]) for resp in line["filtered_resps"]]
            chosen = max(range(len(logliks)), key=lambda k: logliks[k])
            assert [c["text"] for c in side["choices"]] == texts
            assert [c["loglik"] for c in side["choices"]] == pytest.approx(logliks, rel=1e-3)
            assert [c["chosen"] for c in side["choices"]] == [k == chosen for k in range(len(texts))]
            assert [c["gold"] for c in side["choices"]] == [k == int(line["target"]) for k in range(len(texts))]
        else:
            assert side["choices"] == []
    # the same colour for the same probability in both columns: one scale
    colours = {}
    for side in seen["sides"]:
        for cell in side["cells"]:
            colours.setdefault(cell["title"].split(") = ")[1].split(";")[0], set()).add(cell["colour"])
    assert all(len(c) == 1 for c in colours.values())
    errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == []


@pytest.fixture(scope="module")
def diffusion_site(tmp_path_factory) -> tuple[Path, Path]:
    """A run of ``hf-probes-diffusion`` (the diffusion tests' tiny BERT, ``probe_traces=true``) written by lm_eval
    itself, and its report."""
    from tiny_models import save_tiny_bert

    root = tmp_path_factory.mktemp("diffusion-runs")
    data = write_data_dir(root / "data", n=4)
    bert = save_tiny_bert(root / "tiny-bert", seed=7, special_tokens={"mask_token": "<|mask|>"})
    write_lm_eval_runs(root / "runs", {"bert": bert}, data, tasks=[MC, GEN], limit=4, probes="reader",
                       model="hf-probes-diffusion", diffusion_gen_length="4", diffusion_steps="4",
                       diffusion_mc_samples="2")
    out = root / "site"
    build_report([root / "runs"], out, n_resamples=20, seed=0, plots=False)
    return root / "runs", out


@pytest.mark.parametrize("task", [MC, GEN])
def test_a_diffusion_document_draws_its_lens_grid_at_reveal(diffusion_site, driver, task):  # noqa: F811
    """``#docs=<task>&model=<label>&doc=<id>`` of a diffusion model's traced run: one ``data-lens-cell`` per kept layer
    and response position of its trace (the lens at each token's reveal; for multiple choice the scored option's)."""
    from selenium.webdriver.support.ui import WebDriverWait

    runs, site = diffusion_site
    (model,) = [m.name for m in read_runs([runs])]
    doc = 1
    line = next(li for li in lines_of(runs, task)["bert"] if li["doc_id"] == doc)
    trace = line["trace"]
    layers, n = trace["lens_layers"], len(trace["tokens"])
    assert len(trace["lens"]["emitted_prob"]) == len(layers) and n >= 1
    assert trace["lens"]["emitted_prob"][-1] == pytest.approx([math.exp(v) for v in trace["logprob"]], rel=2e-3)
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": 1400, "height": 1200, "deviceScaleFactor": 1, "mobile": False})
    driver.get("about:blank")
    driver.get((site / "index.html").as_uri() + f"#docs={task}&model={model}&doc={doc}")
    WebDriverWait(driver, 30).until(lambda d: d.execute_script(
        "return document.querySelectorAll('#document-detail .doc-model .lens-grid').length === 1;"))
    cells = driver.execute_script(
        "return Array.from(document.querySelectorAll('#document-detail [data-lens-cell]'))"
        ".map(e => e.getAttribute('data-lens-cell'));")
    assert sorted(cells) == sorted(f"{layer},{j}" for layer in layers for j in range(n))
    assert [e for e in driver.get_log("browser") if e["level"] == "SEVERE"] == []
