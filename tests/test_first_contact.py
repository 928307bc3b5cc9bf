"""First contact: what ``lm-eval-probes --help`` shows, the entry points a newer lm_eval discovers, and the
console hygiene of the sweep and demo CLIs (folded lm_eval notices, warnings that name the row, the ETA)."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import sys

import pytest

import lm_eval_probes
from lm_eval_probes.__main__ import attribute_docs, main, option_summary, plugin_help
from lm_eval_probes.config import ProbeConfig
from lm_eval_probes.models.diffusion_config import DiffusionConfig
from lm_eval_probes.harness.registry import DIFFUSION_MODEL_NAME, DIFFUSION_MODEL_TARGET, MODEL_NAME, MODEL_TARGET

# ----------------------------------------------------------------------------------------- --help


def test_help_presents_the_plugin_before_lm_evals_options(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["lm-eval-probes", "--help"])
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code in (0, None)
    out = capsys.readouterr().out
    lm_eval_part = out.index("Language Model Evaluation Harness")  # lm_eval's own help still follows
    plugin = out[:lm_eval_part]
    for text in ("sweep CONFIG.yaml", "report RUN_DIR", "ls tasks", "validate", "run ...",
                 "hf-probes ", "hf-probes-diffusion", lm_eval_probes.TASKS_DIR, "lm_eval_probes.TASKS_DIR",
                 "probes=tcb+bte+reader", "diffusion_steps"):
        assert text in plugin, text
    for key, shown, _, _ in ProbeConfig.option_help():
        assert f"{key}={shown}" in plugin, key


def test_no_arguments_show_the_same_help(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["lm-eval-probes"])
    try:
        main([])
    except SystemExit:  # lm_eval prints its help and returns without arguments
        pass
    assert "sweep CONFIG.yaml" in capsys.readouterr().out


def test_probe_options_come_from_each_probes_declaration():
    from lm_eval_probes.registry import probes

    rows = {f"{key}={shown}": text for key, shown, text, _ in ProbeConfig.option_help()}
    declared = ["probe_gen_capture", "probe_chunk_positions", "probe_traces"] + [
        key for probe in probes() for key in probe.options.keys(probe.name)]
    assert [key.split("=")[0] for key in rows] == declared
    assert all(summary for summary in rows.values()), "every option needs a help text"
    assert rows["probe_tcb_eps=1.0"].startswith("tolerance ε of δ_TCB")
    assert "probe_omega_depth=auto" in rows  # None: resolved per model
    assert "probe_bte_features=0" in rows and "probe_save_states=none" in rows
    assert set(attribute_docs(DiffusionConfig)) >= {f.name for f in dataclasses.fields(DiffusionConfig)}


def test_option_summary_cuts_at_the_first_sentence_outside_parentheses():
    text = "the last positions kept (float16; float32 where needed, e.g. Gemma's) (``probe_reader_tail``); more. Else"
    assert option_summary(text) == "the last positions kept (float16; float32 where needed, e.g. Gemma's)"
    assert option_summary("K of Ω's confidence (``probe_omega_topk``), K >= 1.") == "K of Ω's confidence, K >= 1"
    assert option_summary("see :mod:`lm_eval_probes.probes.bte` for ``x``") == "see lm_eval_probes.probes.bte for x"


def test_plugin_help_imports_neither_torch_nor_lm_eval():
    import subprocess

    code = ("import sys; from lm_eval_probes.__main__ import plugin_help; plugin_help('/t'); "
            "print(sorted(m for m in ('torch', 'lm_eval') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=60,
                          env={"PYTHONPATH": ":".join(p for p in sys.path if p)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


# ----------------------------------------------------------------------------------------- entry points


def test_the_installed_distribution_declares_lm_evals_model_entry_points():
    """lm_eval's plugin discovery (main branch after 0.4.13, ``registry.load_plugins``) registers each
    ``lm_eval.models`` entry point as a lazy placeholder; the class's ``@register_model`` then upgrades it
    only when the entry point's value is the class's own ``module:name``."""
    found = {ep.name: ep for ep in importlib.metadata.entry_points(group="lm_eval.models")
             if ep.dist is not None and ep.dist.name == "lm-eval-probes"}
    assert set(found) == {MODEL_NAME, DIFFUSION_MODEL_NAME}
    for name, target in ((MODEL_NAME, MODEL_TARGET), (DIFFUSION_MODEL_NAME, DIFFUSION_MODEL_TARGET)):
        assert found[name].value == target  # the same class the .pth placeholder names (0.4.13)
        cls = found[name].load()
        assert f"{cls.__module__}:{cls.__name__}" == found[name].value

    from lm_eval.api.model import LM
    from lm_eval.api.registry import get_model

    from lm_eval_probes.models.diffusion import DiffusionProbeHFLM
    from lm_eval_probes.models.autoregressive import ProbeHFLM

    assert found[MODEL_NAME].load() is ProbeHFLM and issubclass(ProbeHFLM, LM)
    assert found[DIFFUSION_MODEL_NAME].load() is DiffusionProbeHFLM
    assert get_model(MODEL_NAME) is ProbeHFLM  # and the registry (0.4.13: through the .pth) agrees
    assert get_model(DIFFUSION_MODEL_NAME) is DiffusionProbeHFLM


# ----------------------------------------------------------------------------------------- console


def test_undefined_rank_correlation_says_why():
    from lm_eval_probes.probes.correlation import UndefinedMetricWarning, partial_spearman_score, spearman_score

    cases = [
        (spearman_score, [(1.0, 1), (1.0, 2), (1.0, 3), (1.0, 4)], "the probe value is the same (1) for all 4 documents"),
        (spearman_score, [(0.1, 2), (0.5, 2), (0.9, 2)], "the difficulty is the same (2) for all 3 documents"),
        (spearman_score, [(0.1, 1), (0.5, None), (0.9, 2)], "only 2 document(s) have a finite probe value and difficulty"),
        (partial_spearman_score, [(1, 1, 1), (2, 3, 2), (3, 2, 3), (4, 4, 5)], "the length ranks the probe value exactly"),
    ]
    for fn, items, cause in cases:
        with pytest.warns(UndefinedMetricWarning) as record:
            assert fn(items) != fn(items)  # nan
        message = str(record[0].message)
        assert cause in message and "usable records" not in message, message


def _lm_eval_logger_output(monkeypatch):
    import io
    import logging

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    for name in ("lm_eval", "lm_eval_probes"):
        monkeypatch.setattr(logging.getLogger(name), "handlers", [handler])
        monkeypatch.setattr(logging.getLogger(name), "propagate", False)
        monkeypatch.setattr(logging.getLogger(name), "level", logging.INFO)
    return handler, stream


def test_repeated_lm_eval_notices_are_folded_inside_the_cli_context_only(monkeypatch):
    import logging

    from lm_eval_probes.terminal.console import tidy_console

    handler, stream = _lm_eval_logger_output(monkeypatch)
    task_logger, sweep_logger = logging.getLogger("lm_eval.api.task"), logging.getLogger("lm_eval_probes.sweep")
    notice = "{}: Custom kwargs can be passed to `--metadata` in console (as json string) or to the TaskManager."
    with tidy_console() as notices:
        for task in ("probes_synth_arith", "probes_synth_logic", "probes_synth_logic_detect"):
            task_logger.warning(notice.format(task))
            task_logger.warning("pretrained=/a/b/%s appears to be an instruct or chat variant", task)
            sweep_logger.info("[1/3] m × %s: done", task)  # the plugin's own lines are never folded
        task_logger.error("boom")
        task_logger.error("boom")
    inside = stream.getvalue()
    assert inside.count("Custom kwargs") == 1 and inside.count("chat variant") == 1
    assert inside.count("done") == 3 and inside.count("boom") == 2
    assert sorted(notices.folded.values()) == [2, 2]
    assert handler.filters == []
    task_logger.warning(notice.format("x"))  # outside the context lm_eval's logging is untouched
    assert stream.getvalue().count("Custom kwargs") == 2


def test_warnings_name_the_pair_and_the_row_not_a_site_packages_path(monkeypatch):
    import inspect
    import warnings

    from lm_eval import evaluator_utils

    from lm_eval_probes.sweep import runner as sweep
    from lm_eval_probes.terminal.console import tidy_console
    from lm_eval_probes.probes.correlation import spearman_score

    # the frames the origin is read from: lm_eval 0.4.13's aggregation loop and the sweep's pair
    assert {"task", "raw_metrics"} <= set(inspect.signature(evaluator_utils._compute_task_aggregations).parameters)
    assert {"model", "task"} <= set(inspect.signature(sweep._evaluate_pair).parameters)

    class Task:
        task_name = "probes_synth_logic"

        def aggregation(self):
            return {"length_spearman": spearman_score}

    class Model:
        name = "SmolLM2-135M-Instruct"

    def _evaluate_pair(model, task):  # stands in for the sweep's (same name, same locals)
        raw = {("length_spearman", "none"): [(3.0, d) for d in range(40)]}
        return evaluator_utils._compute_task_aggregations(Task(), raw, bootstrap_iters=0)

    _, stream = _lm_eval_logger_output(monkeypatch)
    before = warnings.showwarning
    with tidy_console():
        warnings.simplefilter("always")
        _evaluate_pair(Model(), "probes_synth_logic")
        warnings.warn_explicit("plain", UserWarning, "/x/lib/python3.11/site-packages/lm_eval_probes/probes/reader.py", 194)
    lines = stream.getvalue().splitlines()
    assert lines[0] == ("SmolLM2-135M-Instruct × probes_synth_logic, row length_spearman,none of probes_synth_logic: "
                        "UndefinedMetricWarning: Spearman rho is undefined: the probe value is the same (3) for all 40 documents")
    assert lines[1] == "lm_eval_probes/probes/reader.py:194: UserWarning: plain"
    assert warnings.showwarning is before


def test_importing_the_clis_changes_no_logging_or_warnings():
    import subprocess

    code = ("import logging, warnings; show = warnings.showwarning; "
            "import lm_eval_probes.cli.demo, lm_eval_probes.sweep, lm_eval_probes.terminal.console; "
            "print(warnings.showwarning is show, logging.getLogger().handlers, logging.getLogger('lm_eval').filters)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "[]", "[]"]


def test_eta_leaves_out_the_first_pairs_start_up(monkeypatch):
    from lm_eval_probes.sweep import runner as sweep

    clock = iter(range(0, 10_000, 7))
    monkeypatch.setattr(sweep.time, "monotonic", lambda: float(next(clock)))
    progress = sweep.Progress(6)
    lines = [
        progress.line("m", "a", "already done, skipped"),
        progress.line("m", "b", "done", 480.0),  # the first pair run: start-up + work
        progress.line("m", "c", "done", 100.0),
        progress.line("m", "d", "done", 140.0),
        progress.line("m", "e", "already done, skipped"),
        progress.line("m", "f", "done", 120.0),
    ]
    assert lines[0].endswith("ETA after the first pair)")
    assert lines[1].endswith("ETA after the next pair)")
    assert lines[2].endswith("ETA 5m00s)")  # 100 s × 3 pairs left, not 480 s × 3
    assert lines[3].endswith("ETA 4m00s)")  # mean 120 s × 2
    assert lines[4].endswith("ETA 2m00s)")
    assert lines[5].endswith("ETA 0s)")
    assert all(line.startswith(f"[{i}/6] m × ") for i, line in enumerate(lines, 1))
