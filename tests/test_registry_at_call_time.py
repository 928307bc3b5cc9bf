"""The report reads the registry when it runs, not when it is imported: a probe registered after the report's
modules were imported (a plugin installed into a running process; ``registry.refresh()``) gets its column, its
place among the columns, its glossary entry and its headline, and once it is gone again its row is read as a metric
nothing declares."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

# imported, and their views of the registry used, before the plugin registers
from lm_eval_probes import registry
from lm_eval_probes.reports import build_report
from lm_eval_probes.reports.columns import glossary, headline_rows, meaning
from lm_eval_probes.reports.levels import level_metrics
from lm_eval_probes.reports.tables import metric_order
from lm_eval_probes.rows import all_rows, rows_by_name
from plugin_fixtures import EXAMPLE_PLUGIN_SOURCE, installed_plugin
from test_pairwise import correctness, write_run

HNORM = {"hnorm": "lm_eval_probes_hnorm:PROBE"}
TASK = "probes_synth_logic"
N = 40
DESCRIPTION = "mean over documents of the mean L2 norm of the last hidden state over the response positions"
UNDECLARED = "lm_eval metric hnorm (not declared by lm-eval-probes; direction from the results file)"


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """Two models on one task with lm_eval's ``acc``, the plugin's ``hnorm`` row, δ_TCB's ρ records (which carry
    each document's difficulty label) and the response-length baseline."""
    root = tmp_path_factory.mktemp("runs")
    rng = np.random.default_rng(4)
    for k, model in enumerate(("first", "second")):
        levels = rng.integers(1, 4, N).astype(float)
        write_run(root, model, {TASK: {
            "acc": correctness(0.4 + 0.2 * k, k, N),
            "hnorm": rng.uniform(5.0, 9.0, N).tolist(),
            "tcb_spearman": [[float(v), level] for v, level in zip(rng.normal(size=N), levels)],
            "length_spearman": [[float(v), level] for v, level in zip(rng.integers(3, 30, N), levels)],
        }})
    return root


def report(runs: Path, out: Path) -> tuple[object, str, dict, list[str]]:
    """The report of ``runs`` built in this process: (the Report, leaderboard.md, summary.json, the task's columns)."""
    built = build_report([runs], out, n_resamples=50, seed=0, plots=False)
    (table,) = built.tables
    return (built, (out / "leaderboard.md").read_text(), json.loads((out / "summary.json").read_text()),
            [column.metric for column in table.columns])


def glossary_section(markdown: str) -> str:
    return markdown.split("## Glossary", 1)[1]


def test_a_probe_registered_after_import_gets_its_column_and_glossary_and_loses_them_when_gone(runs, tmp_path):
    # the views as they are before the plugin, read now (caches made from the built-ins)
    assert "hnorm" not in rows_by_name() and "hnorm" not in {row.name for row in all_rows()}
    assert not meaning("hnorm").declared and "hnorm" not in metric_order() and "hnorm" not in headline_rows()
    assert [g.key for g in glossary(["hnorm"])] == ["lm-eval"]

    with installed_plugin(tmp_path / "site", HNORM, [EXAMPLE_PLUGIN_SOURCE]):
        probe = registry.probe("hnorm")
        described = meaning("hnorm")
        assert described.declared and described.description == DESCRIPTION and described.arrow == ""  # scored=False
        assert ("hnorm", probe.label) in level_metrics() and "hnorm" in headline_rows()

        built, markdown, summary, columns = report(runs, tmp_path / "with")
        # its place: with the probes' rows, before the baselines (metric_order), not alphabetically after them
        assert columns.index("acc") < columns.index("tcb_spearman") < columns.index("hnorm") < \
            columns.index("length_spearman")
        (table,) = built.tables
        hnorm_column = next(c for c in table.columns if c.metric == "hnorm")
        assert table.is_headline(hnorm_column) and hnorm_column.scored is False
        glossary_text = glossary_section(markdown)
        assert "### probes=hnorm" in glossary_text and probe.summary in glossary_text and DESCRIPTION in glossary_text
        assert probe.formula.replace("<", "&lt;") in glossary_text and UNDECLARED not in markdown
        group = next(g for g in glossary(columns) if g.key == "probe-hnorm")
        assert [e.name for e in group.entries] == ["hnorm"] and group.reads == probe.reads
        # its headline value per difficulty level (levels.level_metrics), labelled by the tcb ρ records
        assert {entry["metric"] for entry in summary["by_level"]} >= {"hnorm", "correct"}

    assert "hnorm" not in registry.names()
    built, markdown, summary, columns = report(runs, tmp_path / "without")
    described = meaning("hnorm", True)
    assert not described.declared and described.description == UNDECLARED and described.arrow == "↑"
    assert columns[-1] == "hnorm"  # an undeclared metric: after every declared row, by name
    (table,) = built.tables
    assert not table.is_headline(next(c for c in table.columns if c.metric == "hnorm"))
    glossary_text = glossary_section(markdown)
    assert "### probes=hnorm" not in glossary_text and DESCRIPTION not in markdown and UNDECLARED in glossary_text
    stock = next(g for g in glossary(columns) if g.key == "lm-eval")
    assert "hnorm" in [e.name for e in stock.entries]
    assert "hnorm" not in {entry["metric"] for entry in summary["by_level"]}
    assert "hnorm" not in rows_by_name() and ("hnorm", probe.label) not in level_metrics()


def test_a_reproduction_reads_its_probes_paper_from_the_registry():
    from lm_eval_probes.reproduce import PROTOCOLS
    from lm_eval_probes.reproduce.protocol import ReproductionProtocol

    for name in ("bte", "omega", "tcb"):
        assert PROTOCOLS[name].probe == name and PROTOCOLS[name].paper == registry.probe(name).paper
    assert PROTOCOLS["calibration"].probe is None and "Unsure but Certain" in PROTOCOLS["calibration"].paper
    tcb = PROTOCOLS["tcb"]
    with pytest.raises(ValueError, match="either a probe .* or a citation"):
        ReproductionProtocol(name="x", summary="", pretrained=tcb.pretrained, default_model=tcb.default_model,
                             model_args={}, variants=tcb.variants, claims=tcb.claims, probe="tcb", citation="a paper")
