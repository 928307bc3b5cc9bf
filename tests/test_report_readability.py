"""The report page explains every column: header titles from the declarations, a glossary with formulas and
papers, arrows only on rows with a better direction, a compact default view of each task table with the rest one
click away, the model column in view, no page overflow at 800 px. On synthetic results and samples files written
here (no model), with every family of rows."""

from __future__ import annotations

import html
import json
import math
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from lm_eval_probes.declarations import PROBES
from lm_eval_probes.reports import build_report
from lm_eval_probes.reports.columns import STOCK_METRICS, glossary, meaning
from lm_eval_probes.reports.corpus_rows import CalibrationOptions, corpus_row
from lm_eval_probes.reports.html import model_name_parts
from lm_eval_probes.rows import ROWS_BY_NAME

N_DOCS = 40
ARROWS = ("↑", "↓")

MC_ROWS = ("acc", "confidence", "ece", "ece_scaled", "selective_auroc", "aurc", "selective_acc_50", "selective_acc_80",
           "lcr_auroc", "lcr_ece", "tcb_log10", "tcb_log10_min", "tcb_spearman", "tcb_spearman_partial",
           "tcb_spearman_partial_prompt", "bte_energy", "bte_profile", "bte_spearman", "bte_spearman_partial",
           "bte_spearman_partial_prompt", "omega", "omega_trajectory", "omega_spearman", "margin", "margin_min",
           "margin_support", "margin_spearman", "length_spearman", "prompt_length_spearman", "response_tokens",
           "difficulty_missing")
"""A multiple-choice task with every probe (probes=all)."""

MC_COMPACT = ("acc", "confidence", "ece", "selective_auroc", "lcr_auroc", "tcb_log10", "tcb_spearman", "bte_energy",
              "bte_spearman", "omega", "omega_spearman", "margin", "margin_spearman")
"""Its compact view, in column order: the correctness row, confidence, ECE, selective AUROC, the reader's AUROC, and
each probe's headline row and its ρ with difficulty."""

GEN_ROWS = ("exact_match", "confidence", "ece", "selective_auroc", "tcb_log10", "tcb_spearman", "response_tokens",
            "empty_responses", "answer_unlocated", "length_spearman")
DETECT_ROWS = ("acc", "confidence", "ece", "selective_auroc", "corruption_auroc", "corruption_confidence_auroc",
               "lcr_auroc", "bte_energy")


# ---------------------------------------------------------------------------------------------- synthetic runs


def task_values(metrics: tuple[str, ...], rng: np.random.Generator, shift: float) -> dict[str, list | float]:
    """Per-document values (or records) of each row, as the plugin writes them into the samples; rows whose
    per-document values are not numbers or records (reader, counts, vectors) get a results value only."""
    correct = (rng.uniform(size=N_DOCS) < 0.4 + 0.4 * shift).astype(float)
    difficulty = rng.integers(1, 4, N_DOCS).astype(float)
    length = rng.integers(3, 30, N_DOCS).astype(float)
    out: dict[str, list | float] = {}
    for name in metrics:
        kind = ROWS_BY_NAME[name].value if name in ROWS_BY_NAME else "correct"
        value = rng.normal(shift, 1.0, N_DOCS)
        if kind == "correct":
            out[name] = correct.tolist()
        elif name == "response_tokens":
            out[name] = (2 + 10 * shift + rng.integers(0, 3, N_DOCS)).astype(float).tolist()
        elif kind == "float":
            out[name] = value.tolist()
        elif kind == "confidence":
            out[name] = np.c_[np.clip(0.3 + 0.5 * correct + rng.normal(0, 0.2, N_DOCS), 0, 1), correct].tolist()
        elif kind == "ranked":
            out[name] = np.c_[value + 0.3 * difficulty, difficulty].tolist()
        elif kind == "partial":
            out[name] = np.c_[value + 0.3 * difficulty, difficulty, length].tolist()
        else:
            out[name] = float(rng.uniform(0, 1))
    return out


def write_run(root: Path, model: str, tasks: dict[str, tuple[str, dict[str, list | float]]]) -> Path:
    """One lm_eval run of ``model``: ``tasks[task] = (filter, values)``; results with lm_eval's directions."""
    folder = root / model
    folder.mkdir(parents=True)
    date = "2026-01-01T00-00-00"
    results, higher, configs, n_samples = {}, {}, {}, {}
    for task, (filter_name, metrics) in tasks.items():
        rows: dict[str, object] = {"alias": task}
        lines = [{"doc_id": i, "filter": filter_name} for i in range(N_DOCS)]
        for metric, values in metrics.items():
            if isinstance(values, float):
                rows[f"{metric},{filter_name}"] = values
                rows[f"{metric}_stderr,{filter_name}"] = "N/A"
                continue
            for line, value in zip(lines, values):
                line[metric] = value
            row = corpus_row(metric)
            array = np.asarray(values, dtype=float)
            if row is None:
                rows[f"{metric},{filter_name}"] = float(array.mean())
                rows[f"{metric}_stderr,{filter_name}"] = float(array.std(ddof=1) / math.sqrt(len(array)))
            else:
                value = row.statistic(array, CalibrationOptions())
                rows[f"{metric},{filter_name}"] = None if not math.isfinite(value) else float(value)
                rows[f"{metric}_stderr,{filter_name}"] = "N/A"
        results[task] = rows
        higher[task] = {m: ROWS_BY_NAME[m].higher_is_better if m in ROWS_BY_NAME else True for m in metrics}
        configs[task] = {"metadata": {}}
        n_samples[task] = {"original": N_DOCS, "effective": N_DOCS}
        with (folder / f"samples_{task}_{date}.jsonl").open("w") as handle:
            handle.writelines(json.dumps(line) + "\n" for line in lines)
    data = {"results": results, "higher_is_better": higher, "configs": configs, "n-samples": n_samples,
            "model_name": model, "config": {"model": "hf-probes", "model_args": f"pretrained={model}"}}
    (folder / f"results_{date}.json").write_text(json.dumps(data))
    return folder


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """Two models on a multiple-choice task with every probe, a generation task (filter first-integer) and a
    detector task; ``long`` is right more often, and writes ~5x more response tokens than ``short``."""
    root = tmp_path_factory.mktemp("readability-runs")
    for model, shift, seed in (("long", 1.0, 1), ("short", 0.0, 2)):
        rng = np.random.default_rng(seed)
        write_run(root, model, {"task_mc": ("none", task_values(MC_ROWS, rng, shift)),
                                "task_gen": ("first-integer", task_values(GEN_ROWS, rng, shift)),
                                "task_detect": ("none", task_values(DETECT_ROWS, rng, shift))})
    return root


@pytest.fixture(scope="module")
def report(runs, tmp_path_factory):
    out = tmp_path_factory.mktemp("readability-report")
    built = build_report([runs], out, n_resamples=200, seed=0, plots=False)
    return built, out


# ---------------------------------------------------------------------------------------------- a small HTML tree

VOID = {"meta", "img", "br", "input", "wbr", "hr", "link", "col"}


@dataclass
class Node:
    tag: str
    attrs: dict[str, str]
    children: list[Node | str] = field(default_factory=list)

    @property
    def classes(self) -> list[str]:
        return (self.attrs.get("class") or "").split()

    def find_all(self, tag: str, cls: str | None = None) -> list[Node]:
        found = []
        for child in self.children:
            if isinstance(child, Node):
                if child.tag == tag and (cls is None or cls in child.classes):
                    found.append(child)
                found += child.find_all(tag, cls)
        return found

    def by_id(self, id_: str) -> Node | None:
        for child in self.children:
            if isinstance(child, Node):
                if child.attrs.get("id") == id_:
                    return child
                inner = child.by_id(id_)
                if inner is not None:
                    return inner
        return None

    def text(self, skip_class: str | None = None) -> str:
        parts = []
        for child in self.children:
            if isinstance(child, str):
                parts.append(child)
            elif skip_class is None or skip_class not in child.classes:
                parts.append(child.text(skip_class))
        return "".join(parts)


class TreeBuilder(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Node("document", {})
        self.stack = [self.root]

    def handle_starttag(self, tag, attrs):
        node = Node(tag, {k: v or "" for k, v in attrs})
        self.stack[-1].children.append(node)
        if tag not in VOID:
            self.stack.append(node)

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        while len(self.stack) > 1:
            if self.stack.pop().tag == tag:
                break

    def handle_data(self, data):
        self.stack[-1].children.append(data)


def parse(page: str) -> Node:
    builder = TreeBuilder()
    builder.feed(page)
    return builder.root


def task_tables(root: Node) -> dict[str, Node]:
    """Task name → its table (the ``h3`` before each ``task-table-N``)."""
    names = {h.attrs["id"].removeprefix("task-"): h.text() for h in root.find_all("h3") if h.attrs.get("id", "").startswith("task-")}
    return {names[t.attrs["id"].removeprefix("task-table-")]: t for t in root.find_all("table")
            if t.attrs.get("id", "").startswith("task-table-")}


def header_metric(th: Node) -> str:
    """The metric a task table's header names (arrow, filter line and the ``<wbr>`` breaks taken off)."""
    return th.text(skip_class="detail").replace("\u00a0", " ").rstrip(" ↑↓")


# ---------------------------------------------------------------------------------------------- the tests


def test_every_header_has_its_declarations_description_as_title(report):
    built, out = report
    root = parse((out / "index.html").read_text())
    tables = task_tables(root)
    assert set(tables) == {"task_mc", "task_gen", "task_detect"}
    for task, table in tables.items():
        head, rank, group, *columns = table.find_all("th")
        assert rank.text().startswith("rank") and group.text().startswith("tie") and rank.attrs["title"]
        assert head.attrs["title"]  # the model column
        shown = [header_metric(th) for th in columns]
        assert shown == [c.metric for c in next(t for t in built.tables if t.task == task).columns]
        for th, metric in zip(columns, shown):
            expected = ROWS_BY_NAME[metric].description if metric in ROWS_BY_NAME else STOCK_METRICS[metric]
            assert th.attrs["title"] == expected, (task, metric)
    for th in root.find_all("th"):  # every header of the page says what it is, none repeats its own text
        assert th.attrs.get("title", "").strip(), th.text()
        assert th.attrs["title"].strip() != th.text().strip(), th.text()
    overview = root.by_id("overview")
    for th, column in zip(overview.find_all("th")[4:], built.overview.columns):
        assert th.attrs["title"].startswith(meaning(column.metric).description)


def test_the_glossary_lists_every_shown_row_with_its_formula_and_paper(report):
    built, out = report
    page = (out / "index.html").read_text()
    root = parse(page)
    assert 'href="#glossary"' in page
    shown = {c.metric for t in built.tables for c in t.columns}
    probe_of = {row.name: probe for probe in PROBES for row in (*probe.rows, *probe.difficulty_rows(), *probe.feeds)}
    sections = {s.attrs["id"]: s for s in root.find_all("section", "glossary-group")}
    listed = {tr.attrs["id"].removeprefix("row-"): tr for s in sections.values() for tr in s.find_all("tr")
              if tr.attrs.get("id", "").startswith("row-")}
    assert set(listed) == shown  # every row shown, nothing else
    for metric in shown:
        entry = listed[metric].text()
        assert meaning(metric).description in entry and meaning(metric).direction_text in entry, metric
        probe = probe_of.get(metric)
        if probe is not None:
            section = sections[f"glossary-probe-{probe.name}"]
            assert metric in {tr.attrs.get("id", "").removeprefix("row-") for tr in section.find_all("tr")}
            text = section.text()
            assert probe.formula in text and probe.paper in text and probe.summary in text, metric
    assert root.by_id("glossary") is not None and root.by_id("glossary").tag == "h2"
    # the same glossary in leaderboard.md, after the task tables
    markdown = (out / "leaderboard.md").read_text()
    glossary_md = markdown.split("\n## Glossary\n", 1)[1]
    for metric in shown:
        assert f"| `{metric}`" in glossary_md, metric
    for probe in PROBES:
        assert probe.formula.replace("<", "&lt;") in glossary_md and probe.paper in glossary_md
    assert markdown.index("## task_mc") < markdown.index("## Glossary")


def test_no_arrow_on_rows_without_a_better_direction(report):
    built, out = report
    root = parse((out / "index.html").read_text())
    checked = {True: 0, False: 0}
    for table in task_tables(root).values():
        for th in table.find_all("th")[3:]:
            metric, text = header_metric(th), th.text(skip_class="detail")
            row = ROWS_BY_NAME.get(metric)
            if row is not None and not row.scored:
                assert not any(a in text for a in ARROWS), metric
                checked[False] += 1
            else:
                higher = row.higher_is_better if row is not None else True
                assert text.endswith("↑" if higher else "↓"), metric
                checked[True] += 1
    assert checked[False] >= 5 and checked[True] >= 20  # the length baselines, counts and response tokens
    for tr in root.find_all("tr"):
        if tr.attrs.get("id", "").startswith("row-"):
            metric = tr.attrs["id"].removeprefix("row-")
            assert any(a in tr.text() for a in ARROWS) == meaning(metric).scored, metric
    markdown = (out / "leaderboard.md").read_text()
    header = next(line for line in markdown.split("## task_mc\n", 1)[1].splitlines() if line.startswith("| model"))
    cells = [c.strip() for c in header.strip("|").split("|")]
    assert "length_spearman" in cells and "response_tokens" in cells and "difficulty_missing" in cells
    assert "ece ↓" in cells and "tcb_spearman ↑" in cells
    summary = json.loads((out / "summary.json").read_text())
    metrics = summary["models"][0]["tasks"]["task_mc"]["metrics"]
    assert metrics["length_spearman,none"]["scored"] is False and metrics["ece,none"]["scored"] is True


def test_rows_without_a_direction_never_win_a_comparison(report):
    """``long`` writes ~5x the response tokens of ``short``: a significant difference, but no win for either; the
    comparison sits in its task's "(no direction)" Holm family, apart from the rows that can win."""
    _, out = report
    summary = json.loads((out / "summary.json").read_text())
    tokens = [e for e in summary["pairwise"] if e["metric"] == "response_tokens"]
    assert {e["task"] for e in tokens} == {"task_mc", "task_gen"}
    for entry in tokens:
        assert entry["p_holm"] < 0.05 and entry["diff"] > 5  # significant, long − short
        assert entry["higher_is_better"] is None and entry["significant_winner"] is None
        assert entry["family"] == f"{entry['task']}/probe (no direction)"
    for entry in summary["pairwise"]:
        if entry["metric"] in ROWS_BY_NAME and not ROWS_BY_NAME[entry["metric"]].scored:
            assert entry["significant_winner"] is None and entry["family"].endswith("(no direction)"), entry["metric"]
        elif entry["family"] != "overview":
            family = ROWS_BY_NAME[entry["metric"]].family if entry["metric"] in ROWS_BY_NAME else "lm_eval"
            assert entry["family"] == f"{entry['task']}/{family}", entry["metric"]
    acc = next(e for e in summary["pairwise"] if e["metric"] == "acc" and e["task"] == "task_mc")
    assert acc["family"] == "overview" and acc["significant_winner"] == "long"  # a row with a direction still wins
    assert "(no direction)" in json.dumps(summary["pairwise_settings"]["families"])


def test_the_compact_view_shows_the_headline_columns_and_the_full_view_all(report):
    built, out = report
    root = parse((out / "index.html").read_text())
    tables = task_tables(root)
    compact = {task: [header_metric(th) for th in table.find_all("th")[3:] if "extra" not in th.classes]
               for task, table in tables.items()}
    assert compact["task_mc"] == list(MC_COMPACT)
    assert compact["task_gen"] == ["exact_match", "confidence", "ece", "selective_auroc", "tcb_log10", "tcb_spearman"]
    assert compact["task_detect"] == ["acc", "confidence", "ece", "selective_auroc", "lcr_auroc", "corruption_auroc",
                                      "bte_energy"]
    for task, table in tables.items():
        full = [header_metric(th) for th in table.find_all("th")[3:]]
        built_table = next(t for t in built.tables if t.task == task)
        assert full == [c.metric for c in built_table.columns]  # the full view: every row of the task
        assert [c.metric for c in built_table.headline_columns] == compact[task]
        extra = ["extra" in th.classes for th in table.find_all("th")[3:]]
        for tr in table.find_all("tr")[1:]:  # each row's cells hidden with their header
            assert ["extra" in td.classes for td in tr.find_all("td")[3:]] == extra
    page = (out / "index.html").read_text()
    assert page.count('class="full-view"') == 2 * len(tables)  # a checkbox and its label per table
    assert f"show all {len(MC_ROWS)} columns" in page and f"show the {len(MC_COMPACT)} headline columns" in page
    assert "input.full-view:not(:checked) ~ .scroll .extra { display: none; }" in page  # no script needed


def test_the_glossary_follows_the_declarations():
    """Probe rows sit under their probe with its formula and paper; lm_eval's own metrics first; each row once."""
    groups = glossary(["acc", "tcb_spearman", "length_spearman", "lcr_auroc", "corruption_confidence_auroc", "unknown_x"])
    keys = [g.key for g in groups]
    assert keys == ["lm-eval", "probe-tcb", "probe-reader", "baselines", "detector"]
    assert [e.name for e in groups[0].entries] == ["acc", "unknown_x"]
    tcb = next(p for p in PROBES if p.name == "tcb")
    assert (groups[1].formula, groups[1].paper) == (tcb.formula, tcb.paper)
    assert meaning("unknown_x", False).higher_is_better is False and meaning("unknown_x").declared is False
    assert not meaning("length_spearman").scored and meaning("length_spearman").arrow == ""


def test_model_names_show_what_tells_namesakes_apart():
    names = ["Gemma (gguf=a.gguf,pretrained=/x/y,probe_bte_profile=full,probes=tcb)", "Gemma (gguf=a.gguf,pretrained=/x/y,probes=tcb)",
             "Smol", "/tmp/models/tiny-llama"]
    parts = model_name_parts(names)
    assert parts[names[0]] == ("Gemma", "probe_bte_profile=full")
    assert parts[names[1]] == ("Gemma", "probe_bte_profile unset")
    assert parts["Smol"] == ("Smol", "") and parts[names[3]] == (names[3], "")


# ---------------------------------------------------------------------------------------------- headless Chromium

LAYOUT_CHECK = """<script>
window.addEventListener("load", function () {
  function visible(table) {
    return Array.prototype.filter.call(table.tHead.rows[0].cells, function (c) { return c.offsetParent !== null; }).length;
  }
  var table = document.getElementById("task-table-3");
  var box = table.parentNode;
  var compact = visible(table);
  box.scrollLeft = 0;
  var label = document.querySelector("label[for='full-view-3']");
  label.click();
  var full = visible(table);
  box.scrollLeft = box.scrollWidth;
  var first = table.tBodies[0].rows[0].cells[0].getBoundingClientRect();
  var out = document.createElement("pre"); out.id = "layout-check";
  out.textContent = JSON.stringify({innerWidth: window.innerWidth, clientWidth: document.documentElement.clientWidth,
    scrollWidth: document.documentElement.scrollWidth, compact: compact, full: full,
    scrolled: box.scrollLeft, firstLeft: first.left, boxLeft: box.getBoundingClientRect().left,
    task: document.getElementById("task-3").textContent});
  document.body.appendChild(out);
});
</script>"""


def chromium_binary() -> str | None:
    return next((path for path in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if path), None)


@pytest.mark.parametrize("width", [800, 1400])
def test_layout_in_headless_chromium(report, tmp_path, width):
    """At 800 and 1400 px: the page does not overflow sideways, a click on "show all" shows every column, and the
    model column stays in view when the table is scrolled to its last column."""
    browser = chromium_binary()
    if browser is None:
        pytest.skip("chromium is not installed (Debian package `chromium`)")
    built, out = report
    checked = tmp_path / "checked.html"
    checked.write_text((out / "index.html").read_text().replace("<head>", "<head>\n" + LAYOUT_CHECK, 1))
    proc = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={tmp_path / 'profile'}", f"--window-size={width},1000", "--virtual-time-budget=5000",
         "--dump-dom", checked.as_uri()],
        capture_output=True, text=True, timeout=120,
    )
    match = re.search(r'<pre id="layout-check">(.*?)</pre>', proc.stdout, re.S)
    assert match, proc.stderr[-3000:]
    check = json.loads(html.unescape(match.group(1)))
    assert check["task"] == "task_mc"
    table = next(t for t in built.tables if t.task == check["task"])
    assert check["scrollWidth"] <= check["clientWidth"]  # tables scroll inside their own box, the page does not
    assert check["compact"] == 3 + len(table.headline_columns) and check["full"] == 3 + len(table.columns)
    assert check["scrolled"] > 0  # the full table is wider than the window
    assert abs(check["firstLeft"] - check["boxLeft"]) < 1.5  # the model column stays at the box's left edge
